"""setup.py - builds mha._mha: libmha from the repository's own Makefile
(`make lib` in the parent directory, or an existing build named by the
environment variable MHA_BUILD_DIR), linked statically into one extension
module.  Metadata lives in pyproject.toml."""
import os
import shlex
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make(*args):
    """Runs make in the repository root and returns its stdout."""
    if not os.path.isfile(os.path.join(ROOT, "Makefile")) or not os.path.isfile(
            os.path.join(ROOT, "include", "mha.h")):
        raise RuntimeError("mha: python/ must stay inside the mha repository (no Makefile at %s)"
                           % ROOT)
    return subprocess.run(["make", "--no-print-directory", "-C", ROOT] + list(args),
                          check=True, stdout=subprocess.PIPE, text=True).stdout


def c_string(text):
    """text as a C string literal."""
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


class BuildWithLibmha(build_ext):
    """build_ext that first builds (or finds) libmha.a and its link flags."""

    def run(self):
        build_dir = os.environ.get("MHA_BUILD_DIR")
        if not build_dir:
            jobs = os.environ.get("MHA_MAKE_JOBS", "2")
            make("-j" + jobs, "lib")
            build_dir = os.path.join(ROOT, "build")
        build_dir = os.path.abspath(os.path.join(ROOT, build_dir))
        lib = os.path.join(build_dir, "libmha.a")
        if not os.path.isfile(lib):
            raise RuntimeError("mha: %s not found (run `make lib`)" % lib)
        ldlibs = shlex.split(make("-s", "print-ldlibs").strip())
        for ext in self.extensions:
            ext.extra_objects = [lib]
            # libmha's symbols stay inside the module: no clash with another libmha
            ext.extra_link_args = ["-Wl,--exclude-libs,ALL"] + ldlibs
        super().run()


setup(
    ext_modules=[Extension("mha._mha", sources=["csrc/_mha.c"],
                           include_dirs=[os.path.join(ROOT, "include")],
                           # where mha.Embedder() looks for models/ last (`make model`)
                           define_macros=[("MHA_SOURCE_ROOT", c_string(ROOT))],
                           extra_compile_args=["-std=c11", "-Wall", "-Wextra",
                                               "-Wno-unused-parameter",
                                               "-Wno-missing-field-initializers",
                                               "-Wno-cast-function-type"])],
    cmdclass={"build_ext": BuildWithLibmha},
)
