# Sourced first by the lab scripts that run on the device (`. "$(dirname "$0")/env.sh" DEFAULT_OUT`):
# the repository root as the working directory, the carried C libraries (.libs) ahead of the
# system's, and $out = $OUT or the script's default, created.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-$1}
mkdir -p "$out"
