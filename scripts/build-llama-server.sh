#!/usr/bin/env bash
# Build llama.cpp's llama-server for CPU, once, into a cache shared by every run on this machine:
#   ${GPUFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}/llama-server-<pin>/llama-server
# The tests and the lab run this real binary (role gpufleet.node.llamacpp_server, tiny GGUF model).
#
# Source: the llama.cpp that the PyPI sdist of llama-cpp-python vendors at vendor/llama.cpp
# (fetched with pip, from whatever index pip is configured for; GitHub is not needed). The pin is
# LLAMA_CPP_PYTHON_VERSION below; the binary is static (BUILD_SHARED_LIBS=OFF), generic x86-64
# (GGML_NATIVE=OFF), without libcurl (models are fetched by the role, never by the server).
# Real GPU nodes build the same source with -DGGML_CUDA=ON (see README "llama.cpp backend").
#
# Cached: a second call checks the binary answers --version and does nothing else.
# Environment: GPUFLEET_CACHE (cache root), LLAMA_BUILD_JOBS (default 2), PIP (pip to use).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
LLAMA_CPP_PYTHON_VERSION=0.3.16
cache=${GPUFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}
dest=$cache/llama-server-$LLAMA_CPP_PYTHON_VERSION
bin=$dest/llama-server
if [[ -x $bin ]] && "$bin" --version >/dev/null 2>&1; then
  echo "build-llama-server: cached $bin"
  exit 0
fi
pip=${PIP:-$repo/.venv/bin/pip}
[[ -x $pip ]] || pip="python3 -m pip"
for tool in cmake c++ tar; do
  command -v "$tool" >/dev/null || { echo "build-llama-server: $tool is missing; install cmake and g++ (apt-get install cmake g++)" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "build-llama-server: fetching llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist) for its vendored llama.cpp"
$pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$work"
tar xzf "$work"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz -C "$work"
src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp
[[ -f $src/CMakeLists.txt ]] || { echo "build-llama-server: no vendor/llama.cpp in the sdist" >&2; exit 1; }
jobs=${LLAMA_BUILD_JOBS:-2}
start=$SECONDS
nice -n 10 cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF >"$work/configure.log" \
  || { cat "$work/configure.log" >&2; exit 1; }
echo "build-llama-server: building llama-server with $jobs jobs (several minutes on 2 cores)"
nice -n 10 cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 \
  || { tail -50 "$work/build.log" >&2; exit 1; }
mkdir -p "$dest"
install -m 0755 "$work/build/bin/llama-server" "$bin.tmp"
"$bin.tmp" --version >/dev/null 2>&1 || { echo "build-llama-server: the built binary does not run" >&2; exit 1; }
mv "$bin.tmp" "$bin"
echo "build-llama-server: built $bin in $((SECONDS - start)) s"
