#!/usr/bin/env bash
# The installed package (docs/api.md): cmake --install into a temporary prefix; pkg-config
# reads loom.pc there; examples/consumer, a separate CMake project that knows nothing but the
# prefix, is configured, built, and run on 2 ranks under the installed loomrun with a built-in
# and with a user-registered strategy. Then the same against the Debian package's files
# (cpack -G DEB, unpacked with dpkg-deb -x), and the package installed and removed by dpkg
# itself in a scratch root with a database of its own: the machine's packages are not
# touched.
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
# The consumer is compiled by the compiler the package was, as a user of that build would.
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$B/CMakeCache.txt")
# pkg-config's flags alone build it (docs/api.md's command): Loom's libraries are static, so
# the flags must name every library they need.
# shellcheck disable=SC2046  # the flags are words
"$cxx" -O1 "$S/examples/consumer/trainer.cpp" -o "$d/consumer-pc" \
  $(PKG_CONFIG_PATH="$d/prefix/lib/pkgconfig" pkg-config --cflags --libs loom) > "$d/pc-build.log" 2>&1 || { cat "$d/pc-build.log"; exit 1; }
"$d/consumer-pc" > "$d/pc.log" 2>&1 || { cat "$d/pc.log"; exit 1; }
grep -q "consumer rank 0 of 1 (single_device)" "$d/pc.log" || { cat "$d/pc.log"; exit 1; }
cmake -S "$S/examples/consumer" -B "$d/consumer" -DCMAKE_PREFIX_PATH="$d/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release > "$d/configure.log" 2>&1 || { cat "$d/configure.log"; exit 1; }
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
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release > "$d/configure-deb.log" 2>&1 || { cat "$d/configure-deb.log"; exit 1; }
cmake --build "$d/consumer-deb" > "$d/build-deb.log" 2>&1 || { cat "$d/build-deb.log"; exit 1; }
"$d/consumer-deb/consumer" > "$d/deb.log" 2>&1 || { cat "$d/deb.log"; exit 1; }
grep -q "consumer rank 0 of 1 (single_device)" "$d/deb.log"
# dpkg -i / -r. Its dependencies are not in the scratch root (--force-depends), so each is
# checked by name against this machine's database instead: a real install would resolve them.
deb=$(ls "$d"/deb/loom_*.deb)
for dep in $(dpkg-deb -f "$deb" Depends | tr -d ' ' | tr ',' ' '); do
  dpkg -s "${dep%%(*}" > /dev/null 2>&1 || { echo "the .deb depends on '$dep', which no installed package provides"; exit 1; }
done
r="$d/dpkgroot"
mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates"
touch "$r/var/lib/dpkg/status"
dpkg --root="$r" --force-depends -i "$deb" > "$d/dpkg-i.log" 2>&1 || { cat "$d/dpkg-i.log"; exit 1; }
dpkg --root="$r" -s loom | grep -q "^Status: install ok installed"
listed=$(dpkg --root="$r" -L loom | while read -r f; do [ -f "$r$f" ] && echo "$f"; done | wc -l)
shipped=$(dpkg-deb -c "$deb" | grep -c '^-')
[ "$listed" -eq "$shipped" ] || { echo "dpkg lists $listed installed files, the .deb ships $shipped"; exit 1; }
test -x "$r/usr/bin/loomrun"
dpkg --root="$r" -r loom > "$d/dpkg-r.log" 2>&1 || { cat "$d/dpkg-r.log"; exit 1; }
if dpkg --root="$r" -s loom > /dev/null 2>&1; then echo "dpkg -r left loom installed"; exit 1; fi
left=$(find "$r" -mindepth 1 -not -path "$r/var/lib/dpkg*" -type f | head -5)
[ -z "$left" ] || { echo "dpkg -r left files behind: $left"; exit 1; }
echo "dpkg installs $shipped files and removes them all"
echo "the installed package builds and runs a consumer"
