"""Headless OpenGL for MuJoCo's renderer: EGL where it works, OSMesa otherwise, no display needed.

MuJoCo picks its GL backend from `MUJOCO_GL` once, when `mujoco` is first
imported (and PyOpenGL its platform from `PYOPENGL_PLATFORM` on its first
import), so the choice is made here, before either import: an explicit
`MUJOCO_GL` is kept; otherwise EGL is probed with plain ctypes (no PyOpenGL,
so nothing is committed yet) and OSMesa taken when EGL has no usable display.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import sys

from omni_ros.errors import OmniRosError

_BACKENDS = ("egl", "osmesa", "glfw", "glx")


class GLBackendError(OmniRosError, RuntimeError):
    """No OpenGL backend MuJoCo can render with headless."""


_EGL_PLATFORM_DEVICE_EXT = 0x313F


def _egl_works() -> bool:
    """An EGL device display can be initialised, the way MuJoCo's EGL context opens one (no X server)."""
    name = ctypes.util.find_library("EGL") or "libEGL.so.1"
    try:
        egl = ctypes.CDLL(name)
    except OSError:
        return False
    egl.eglGetProcAddress.restype = ctypes.c_void_p
    egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    query_ptr = egl.eglGetProcAddress(b"eglQueryDevicesEXT")
    display_ptr = egl.eglGetProcAddress(b"eglGetPlatformDisplayEXT")
    if not query_ptr or not display_ptr:
        return False
    pointers = ctypes.POINTER(ctypes.c_void_p)
    query = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, pointers, ctypes.POINTER(ctypes.c_int))(query_ptr)
    get_display = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)(display_ptr)
    devices = (ctypes.c_void_p * 8)()
    count = ctypes.c_int(0)
    if not query(8, devices, ctypes.byref(count)):
        return False
    egl.eglInitialize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    egl.eglTerminate.argtypes = [ctypes.c_void_p]
    for device in devices[: count.value]:
        display = get_display(_EGL_PLATFORM_DEVICE_EXT, device, None)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if display and egl.eglInitialize(display, ctypes.byref(major), ctypes.byref(minor)):
            egl.eglTerminate(display)
            return True
    return False


def _imported(module: str) -> bool:
    return module in sys.modules


def _osmesa_available() -> bool:
    return ctypes.util.find_library("OSMesa") is not None


def select_gl_backend() -> str:
    """Set `MUJOCO_GL` (and `PYOPENGL_PLATFORM`) for headless rendering; returns the backend chosen.

    Call before the first `import mujoco`. Raises GLBackendError, naming what to install, when neither
    EGL nor OSMesa can be used.
    """
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if not chosen:
        late = _imported("mujoco")
        if late and _imported("OpenGL"):
            raise GLBackendError(
                "mujoco and PyOpenGL were imported before omni_ros chose a headless GL backend: set MUJOCO_GL=egl "
                "(or osmesa) in the environment, or import omni_ros.sim.so101 first"
            )
        if _egl_works():
            chosen = "egl"
        elif _osmesa_available():
            chosen = "osmesa"
        else:
            raise GLBackendError(
                "no headless OpenGL for the MuJoCo simulator: EGL cannot open a display and OSMesa is not "
                "installed (apt-get install libegl1 libgl1-mesa-dri, or libosmesa6), or set MUJOCO_GL"
            )
        os.environ["MUJOCO_GL"] = chosen
        os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
        if late:
            # mujoco bound GLFW (which needs a display) at import; point its renderer at the headless context.
            from mujoco.rendering.classic import gl_context

            gl_context.GLContext = importlib.import_module(f"mujoco.{chosen}").GLContext
        return chosen
    if chosen in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", chosen)
    if chosen not in _BACKENDS:
        raise GLBackendError(f"MUJOCO_GL={chosen!r} is not a backend MuJoCo knows on Linux ({', '.join(_BACKENDS)})")
    return chosen


def release_current_context() -> None:
    """Unbind this thread's GL context, so the next render may come from any thread.

    An EGL or OSMesa context is current in one thread at a time; MuJoCo's renderer makes its context current
    before each frame but never releases it, so a frame from another thread (a ROS executor with several
    threads, a helper thread) would fail with EGL_BAD_ACCESS.
    """
    backend = os.environ.get("MUJOCO_GL", "").lower()
    if backend == "egl":
        import mujoco.egl
        from mujoco.egl import egl_ext as EGL

        if mujoco.egl.EGL_DISPLAY is not None:
            EGL.eglMakeCurrent(mujoco.egl.EGL_DISPLAY, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, EGL.EGL_NO_CONTEXT)
    elif backend == "osmesa":
        from OpenGL import GL, osmesa

        osmesa.OSMesaMakeCurrent(None, None, GL.GL_FLOAT, 0, 0)
