# Sourced by bench/profile.sh and bench/timeline.sh: finds the release binaries they drive and
# checks that perf is there. Sets `bench` (lock-bench) and `lockd` (LOCKD_BIN picks another
# lockd); exits 2 naming what is missing.
target=${CARGO_TARGET_DIR:-target}
bench="$target/release/lock-bench"
lockd=${LOCKD_BIN:-$target/release/lockd}
for bin in "$bench" "$lockd"; do
  [ -x "$bin" ] || { echo "missing $bin: cargo build --release -p lockd -p lock-bench" >&2; exit 2; }
done
command -v perf >/dev/null || { echo "perf not found (Debian: apt-get install linux-perf)" >&2; exit 2; }
