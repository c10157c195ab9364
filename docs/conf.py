"""Sphinx configuration of the ms_optim documentation.

Built offline: no intersphinx, no remote images; the API pages are generated from the docstrings
(autodoc, Google-style sections through napoleon). Build: ``bash scripts/docs.sh``.
"""
from __future__ import annotations

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
os.environ.setdefault("GLOG_v", "3")  # MindSpore: errors only while autodoc imports it

import ms_optim  # noqa: E402

project = "ms_optim"
author = "ms_optim contributors"
copyright = "ms_optim contributors"  # noqa: A001  (Sphinx's name)
release = ms_optim.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx-mathjax-offline",  # MathJax shipped in the package: pages render formulas offline
]

exclude_patterns = ["_build"]
root_doc = "index"
language = "en"

autodoc_member_order = "bysource"
autodoc_preserve_defaults = True  # show `lambda x: ...` as written, not <function>
autodoc_typehints = "none"  # the signatures are MindSpore's; types are in the Args sections
autodoc_default_options = {"members": False, "undoc-members": False}
autoclass_content = "class"
add_module_names = True

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = [("Inputs", "params_style"), ("Outputs", "returns_style"),
                            ("Supported Platforms", "notes_style"), ("State", "notes_style")]

html_theme = "sphinx_rtd_theme"
html_title = f"ms_optim {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_show_sourcelink = False
html_theme_options = {"navigation_depth": 3, "collapse_navigation": False}

pygments_style = "sphinx"

# The machine every figure of these pages was measured on, and where the results live.
rst_epilog = """
.. |machine| replace:: 2-core x86_64 CPU, 24 GiB, MindSpore 2.10.0 on CPU
"""

# A few docstrings qualify a section heading ("Args (as ``mindspore.train.Model``):") or put its text on
# the heading's line ("Args: as ``nn.Conv2d`` (...)"); napoleon only knows the bare heading. Before
# napoleon reads them, the qualifier becomes a sentence above a bare heading.
_QUALIFIED = re.compile(r"^(\s*)(Args|Raises|Returns) \((.+)\):\s*$")
_INLINE = re.compile(r"^(\s*)(Args): (\S.*)$")


def _plain_section_headings(app, what, name, obj, options, lines):
    """Rewrite qualified section headings in place (see above); other lines unchanged."""
    out = []
    for line in lines:
        qualified, inline = _QUALIFIED.match(line), _INLINE.match(line)
        if qualified:
            indent, head, note = qualified.groups()
            out += [f"{indent}{head[0].upper()}{head[1:]} {note}.", "", f"{indent}{head}:"]
        elif inline:
            indent, head, text = inline.groups()
            out += [f"{indent}Arguments: {text}"]
        else:
            out.append(line)
    lines[:] = out


def setup(app):
    app.connect("autodoc-process-docstring", _plain_section_headings, priority=100)
