#!/usr/bin/env bash
# The installed package (docs/api.md): cmake --install into a temporary prefix; pkg-config
# reads loom.pc there; examples/consumer, a separate CMake project that knows nothing but the
# prefix, is configured, built, and run on 2 ranks under the installed loomrun with a built-in
# and with a user-registered strategy. Then the same against the Debian package's files
# (cpack -G DEB, unpacked with dpkg-deb -x: the test does not install it on the machine).
#   consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
B=$1; S=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cmake --install "$B" --prefix "$d/prefix" > "$d/install.log"
test -f "$d/prefix/include/loom/strategies/fabric.h"
test -f "$d/prefix/lib/cmake/Loom/LoomConfigVersion.cmake"
test -x "$d/prefix/bin/train_gpt"
PKG_CONFIG_PATH="$d/prefix/lib/pkgconfig" pkg-config --cflags --libs loom > "$d/pc.txt"
grep -q -- "-I$d/prefix/lib/pkgconfig/../../include/loom" "$d/pc.txt" || { cat "$d/pc.txt"; exit 1; }
cmake -S "$S/examples/consumer" -B "$d/consumer" -DCMAKE_PREFIX_PATH="$d/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$d/configure.log" 2>&1 || { cat "$d/configure.log"; exit 1; }
cmake --build "$d/consumer" > "$d/build.log" 2>&1 || { cat "$d/build.log"; exit 1; }
run() {  # strategy: 2 ranks under the installed launcher
  "$d/prefix/bin/loomrun" --nproc-per-node 2 --master-port 0 "$d/consumer/consumer" \
    --strategy "$1" > "$d/$1.log" 2>&1 || { cat "$d/$1.log"; exit 1; }
}
run ddp
grep -q "consumer rank 1 of 2 (ddp)" "$d/ddp.log"
run my_ddp
grep -q "consumer rank 0 of 2 (my_ddp).*30 counted backward passes" "$d/my_ddp.log"
cat "$d/my_ddp.log"
# The .deb: its files, unpacked, serve the consumer the same way.
(cd "$B" && cpack -G DEB -B "$d/deb" > "$d/cpack.log" 2>&1) || { cat "$d/cpack.log"; exit 1; }
dpkg-deb -x "$d"/deb/loom_*.deb "$d/debroot"
cmake -S "$S/examples/consumer" -B "$d/consumer-deb" -DCMAKE_PREFIX_PATH="$d/debroot/usr" \
  -DCMAKE_BUILD_TYPE=Release > "$d/configure-deb.log" 2>&1 || { cat "$d/configure-deb.log"; exit 1; }
cmake --build "$d/consumer-deb" > "$d/build-deb.log" 2>&1 || { cat "$d/build-deb.log"; exit 1; }
"$d/consumer-deb/consumer" > "$d/deb.log" 2>&1 || { cat "$d/deb.log"; exit 1; }
grep -q "consumer rank 0 of 1 (single_device)" "$d/deb.log"
echo "the installed package builds and runs a consumer"
