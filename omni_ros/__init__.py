"""omni_ros: serve vision-language-action policies on the robot."""

import pkgutil

# The generated message modules (omni_ros.msg) are installed by the message
# build into a second omni_ros directory; extend_path makes both halves one
# package, whichever of them comes first on sys.path.
__path__ = pkgutil.extend_path(__path__, __name__)

# Before anything here can import torch: its OpenMP workers sleep rather than spin while they wait, so a busy
# robot computer does not multiply inference latency (omni_ros/cpu_threads.py; the environment's choice wins).
from omni_ros import cpu_threads as _cpu_threads

_cpu_threads.apply_defaults()

__version__ = "0.1.0"
