# Sourced by the bench scripts, from the repository root: sets P to the probe binary to
# measure, $PROBE_BIN when given, else a release build of this checkout.
if [ -n "${PROBE_BIN:-}" ]; then
  P="$PROBE_BIN"
else
  cargo build --release --quiet
  P="$PWD/target/release/probe"
fi
