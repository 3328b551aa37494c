"""omni_ros: serve vision-language-action policies on the robot."""

import pkgutil

# The generated message modules (omni_ros.msg) are installed by the message
# build into a second omni_ros directory; extend_path makes both halves one
# package, whichever of them comes first on sys.path.
__path__ = pkgutil.extend_path(__path__, __name__)

# Before anything here can import torch: its OpenMP workers sleep rather than spin while they wait, so a busy
# robot computer does not multiply inference latency (omni_ros/cpu_threads.py; the environment's choice wins).
# Before any thread of ours allocates: an inference's freed buffers stay mapped for the next one, every thread on
# one heap (omni_ros/heap.py; the environment's settings win, OMNI_ROS_KEEP_FREED_HEAP=0 opts out).
from omni_ros import cpu_threads as _cpu_threads
from omni_ros import heap as _heap

_cpu_threads.apply_defaults()
_heap.keep_freed_heap()

__version__ = "0.1.0"
