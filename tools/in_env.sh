#!/usr/bin/env bash
# Run a command in the twinloop environment: the venv (and, where a ROS 2 distribution
# was used to build the workspace, its colcon install space).
set -eo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${ROS_DISTRO:-}" && -f "$ROOT/install/setup.bash" ]]; then
  # shellcheck disable=SC1091
  source "$ROOT/install/setup.bash"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# DDS stays on this host unless the user says otherwise.
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export FASTDDS_DEFAULT_PROFILES_FILE="${FASTDDS_DEFAULT_PROFILES_FILE:-$ROOT/config/fastdds_localhost.xml}"
export MUJOCO_GL="${MUJOCO_GL:-egl}"
exec "$@"
