# Another Triton version on the GPU machine, which has torch 2.11 with triton 3.6 and no network.
# A triton wheel (200-290 MB) is over what a call carries (64 MiB), so `pack` makes a tarball of it
# without what these runs do not use, and `use` puts it in front of the machine's own:
#
#   here:  bash scripts/triton_carried.sh pack 3.9.0 .peers/tw     # -> .peers/tw/triton-3.9.0.tar.xz
#   there: source scripts/triton_carried.sh use .peers/tw/triton-3.9.0.tar.xz
#          bash scripts/gpu_run.sh tests-rest "$OUT"
#
# pack: the cp312 manylinux x86_64 wheel (pip download), less its ptxas, nvdisasm, CUPTI and
# proton libraries, its instrumentation test library and AMD's code generator (the AMD backend's
# Python stays: Triton imports every backend its entry points name, the machine's 3.6 among them),
# libtriton.so stripped of symbols; xz. 3.7.1: 39 MB, 3.9.0: 42 MB (2026-11-29).
# use: unpacks to /tmp/triton-carried, prepends it to PYTHONPATH, and points TRITON_PTXAS_PATH at
# the machine's own ptxas (that of its triton 3.6: CUDA 12.8, or ptxas-blackwell, CUDA 12.9, for
# 3.8 and later, whose PTX 12.8 does not take). tests/test_compiled_tiles.py skips its builds
# without the carried version's own ptxas.
case "${1:-}" in
  pack)
    set -u
    version=${2:?version}; dest=${3:?folder}
    work=$(mktemp -d) || exit
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$work" "triton==$version" || exit
    (cd "$work" && unzip -q triton-*.whl && rm triton-*.whl) || exit
    t="$work/triton"
    rm -rf "$t"/backends/nvidia/bin/ptxas* "$t"/backends/nvidia/bin/nvdisasm \
      "$t"/backends/nvidia/lib/cupti* "$t"/_C/libproton.so "$t"/instrumentation/*.so \
      "$t"/backends/amd/lib/*.so
    strip --strip-unneeded "$t/_C/libtriton.so" || exit
    mkdir -p "$dest" || exit
    (cd "$work" && XZ_OPT="-6 -T2" tar -cJf - triton "triton-$version.dist-info") \
      > "$dest/triton-$version.tar.xz" || exit
    rm -rf "$work"
    ls -la "$dest/triton-$version.tar.xz" ;;
  use)
    tarball=${2:?tarball}
    own=$(python3 -c "import os, triton; print(os.path.dirname(triton.__file__))") || return 1
    version=$(basename "$tarball" .tar.xz); version=${version#triton-}
    rm -rf /tmp/triton-carried && mkdir -p /tmp/triton-carried \
      && tar -xJf "$tarball" -C /tmp/triton-carried || return 1
    case "$version" in
      3.6*|3.7*) ptxas=ptxas ;;
      *) ptxas=ptxas-blackwell ;;
    esac
    export PYTHONPATH="/tmp/triton-carried${PYTHONPATH:+:$PYTHONPATH}"
    export TRITON_PTXAS_PATH="$own/backends/nvidia/bin/$ptxas"
    export TRITON_PTXAS_BLACKWELL_PATH="$own/backends/nvidia/bin/ptxas-blackwell"
    python3 -c "import triton; print('triton', triton.__version__, 'from', triton.__file__)" \
      || return 1
    "$TRITON_PTXAS_PATH" --version | tail -1 ;;
  *) echo "usage: triton_carried.sh pack VERSION FOLDER | use TARBALL (sourced)" >&2
     return 2 2>/dev/null || exit 2 ;;
esac
