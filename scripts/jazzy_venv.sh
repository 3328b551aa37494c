#!/usr/bin/env bash
# Creates (once) the venv of the Jazzy interoperability test (test/test_jazzy_interop.py): a robot process built
# only from the ROS 2 Jazzy wheels, as robots in the field run Jazzy while omni_ros runs on the Kilted wheels.
# It is never the product venv. The Jazzy wheels are cp312 and have no ros-wheels-bootstrapper: their libraries
# are found through LD_LIBRARY_PATH, which $VENV/bin/jazzy-python (written here) sets before it runs Python.
#   JAZZY_VENV   where the venv lives (default .venv-jazzy in the repo root)
#   JAZZY_PYTHON the Python 3.12 interpreter (default: pyenv's 3.12.1)
# About 50 s and 240 MB the first time here; then under a second (it checks the imports and the pinned set).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${JAZZY_VENV:-$ROOT/.venv-jazzy}"
# What the robot process imports; pinned to the versions verified to talk to the Kilted wheels over Fast DDS.
PACKAGES=(
  "ros-jazzy-rclpy==7.1.6"
  "ros-jazzy-std-msgs==5.3.6"
  "ros-jazzy-sensor-msgs==5.3.6"
  "ros-jazzy-trajectory-msgs==5.3.6"
  "ros-jazzy-rmw-fastrtps-cpp==8.4.3"
)

if [ -x "$VENV/bin/jazzy-python" ] \
  && "$VENV/bin/jazzy-python" -c 'import rclpy, sensor_msgs.msg, std_msgs.msg, trajectory_msgs.msg' 2>/dev/null \
  && [ "$(cat "$VENV/.omni_ros_jazzy" 2>/dev/null)" = "${PACKAGES[*]}" ]; then
  echo "[jazzy] ROS 2 Jazzy wheels already in $VENV"
  exit 0
fi

# No Python 3.12 here: not an error of `make test` (the interop test then skips, naming this script), unless
# JAZZY_REQUIRED=1. A failing install below always is one.
no_python() {
  echo "[jazzy] warning: $1; test/test_jazzy_interop.py will be skipped (set JAZZY_PYTHON to a Python 3.12)" >&2
  [ "${JAZZY_REQUIRED:-0}" = 1 ] && exit 1
  exit 0
}
PYTHON="${JAZZY_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  command -v pyenv >/dev/null 2>&1 || no_python "pyenv not found"
  PYTHON="$(pyenv prefix 3.12.1 2>/dev/null)/bin/python"
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
  || no_python "$PYTHON is not Python 3.12 (the Jazzy wheels are cp312)"

echo "[jazzy] creating $VENV with $PYTHON and installing ${PACKAGES[*]}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" \
  2> >(grep -v "is ignored: it is neither" >&2)
# The one way to run it: this venv's libraries only (a Kilted LD_LIBRARY_PATH inherited from the product venv's
# bootstrapper would load the wrong rcl), and its own ament index for the rmw implementation.
cat > "$VENV/bin/jazzy-python" <<'SH'
#!/usr/bin/env bash
VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
libs="$VENV/lib"
for d in "$VENV"/lib/python3.12/site-packages/*.libs; do libs="$libs:$d"; done
export LD_LIBRARY_PATH="$libs" AMENT_PREFIX_PATH="$VENV"
unset PYTHONPATH PYTHONHOME CMAKE_PREFIX_PATH
exec "$VENV/bin/python" "$@"
SH
chmod +x "$VENV/bin/jazzy-python"
"$VENV/bin/jazzy-python" -c 'import rclpy, sensor_msgs.msg, trajectory_msgs.msg; print("[jazzy] rclpy from", rclpy.__file__)'
echo "${PACKAGES[*]}" > "$VENV/.omni_ros_jazzy"
