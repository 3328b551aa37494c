#!/usr/bin/env bash
# Set up everything omni_ros needs in a project virtual environment:
#   1. the venv itself (.venv, or $OMNI_ROS_VENV),
#   2. PyTorch (CPU build, pinned) and the Python dependencies, ROS 2 wheels and ONNX Runtime + QNN EP included,
#   3. the custom messages in msg/, built with CMake into the venv,
#   4. control_msgs (FollowJointTrajectory, interfaces/control_msgs), built the same way only where no
#      control_msgs is installed (there is no wheel; a sourced ROS install's is used instead),
#   5. omni_ros itself in editable mode (the `omni-ros` command).
# Each step records a fingerprint of its inputs and is skipped when nothing
# changed, so a second run takes a second or two.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${OMNI_ROS_VENV:-$ROOT/.venv}"
PYTHON="${OMNI_ROS_PYTHON:-python3}"
TORCH_SPEC="${OMNI_ROS_TORCH_SPEC:-torch==2.13.0}"
STAMPS="$VENV/.omni_ros"
BUILD="$ROOT/build/msgs"

log() { printf '[setup] %s\n' "$*"; }
# pip prints a warning per package for index folders this machine's pip
# config names but lacks; they are noise, not problems.
pip_q() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
fingerprint() { (cd "$ROOT" && cat "$@" && echo "$TORCH_SPEC" && "$PYTHON" -V) | sha256sum | cut -d' ' -f1; }
up_to_date() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
mkdir -p "$STAMPS"

deps=$(fingerprint requirements/base.txt requirements/qnn.txt requirements/nodeps.txt setup.py)
if up_to_date deps "$deps"; then
  log "python dependencies up to date"
else
  log "installing $TORCH_SPEC first, so nothing pulls another torch build"
  pip_q install "$TORCH_SPEC"
  log "installing dependencies (requirements/base.txt, requirements/qnn.txt)"
  pip_q install -r "$ROOT/requirements/base.txt" -r "$ROOT/requirements/qnn.txt" "$TORCH_SPEC"
  pip_q install --no-deps -r "$ROOT/requirements/nodeps.txt"
  log "installing omni_ros in editable mode"
  pip_q install --no-deps --no-build-isolation --config-settings editable_mode=compat -e "$ROOT"
  echo "$deps" > "$STAMPS/deps"
fi

msgs=$(fingerprint CMakeLists.txt cmake/*.cmake package.xml msg/*.msg action/*.action)
MSG_PREFIX="$VENV/lib/omni_ros_msgs"
if up_to_date msgs "$msgs" && [ -d "$MSG_PREFIX/omni_ros/msg" ]; then
  log "messages up to date"
else
  log "building messages (msg/*.msg, action/*.action -> omni_ros.msg, omni_ros.action)"
  export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF \
    -DPYTHON_INSTALL_DIR=lib/omni_ros_msgs -DOMNI_ROS_INSTALL_PYTHON_SOURCES=OFF > "$STAMPS/cmake.log" 2>&1 \
    && cmake --build "$BUILD" -j2 >> "$STAMPS/cmake.log" 2>&1 \
    && cmake --install "$BUILD" >> "$STAMPS/cmake.log" 2>&1 \
    || { tail -40 "$STAMPS/cmake.log" >&2; log "message build failed, full log: $STAMPS/cmake.log"; exit 1; }
  # After the editable source tree on sys.path, so `import omni_ros` is the
  # source package and omni_ros.msg comes from the generated half.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$MSG_PREFIX" > "$site/omni_ros_msgs.pth"
  echo "$msgs" > "$STAMPS/msgs"
fi

# control_msgs: ours only where none is importable from elsewhere (a robot's ROS install on PYTHONPATH).
cm_src="$ROOT/interfaces/control_msgs"
cm=$(fingerprint cmake/*.cmake interfaces/control_msgs/CMakeLists.txt interfaces/control_msgs/package.xml \
  interfaces/control_msgs/msg/*.msg interfaces/control_msgs/action/*.action)
installed=$("$VENV/bin/python" -c 'import control_msgs, os; print(os.path.dirname(control_msgs.__file__))' 2>/dev/null || true)
if [ -n "$installed" ] && [ "${installed#"$MSG_PREFIX"}" = "$installed" ]; then
  log "control_msgs installed ($installed): using it"
elif up_to_date control_msgs "$cm" && [ -d "$MSG_PREFIX/control_msgs/action" ]; then
  log "control_msgs up to date"
else
  log "building control_msgs (interfaces/control_msgs: FollowJointTrajectory, no wheel exists)"
  export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
  cmake -S "$cm_src" -B "$ROOT/build/control_msgs" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF \
    -DPYTHON_INSTALL_DIR=lib/omni_ros_msgs > "$STAMPS/control_msgs.log" 2>&1 \
    && cmake --build "$ROOT/build/control_msgs" -j2 >> "$STAMPS/control_msgs.log" 2>&1 \
    && cmake --install "$ROOT/build/control_msgs" >> "$STAMPS/control_msgs.log" 2>&1 \
    || { tail -40 "$STAMPS/control_msgs.log" >&2; log "control_msgs build failed, log: $STAMPS/control_msgs.log"; exit 1; }
  echo "$cm" > "$STAMPS/control_msgs"
fi

log "ready: $VENV (activate with: source $VENV/bin/activate)"
