"""omni_ros: serve vision-language-action policies on the robot."""

import pkgutil

# The generated message modules (omni_ros.msg) are installed by the message
# build into a second omni_ros directory; extend_path makes both halves one
# package, whichever of them comes first on sys.path.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"
