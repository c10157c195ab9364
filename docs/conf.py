"""Sphinx configuration of the ms_optim documentation.

Built offline: no intersphinx, no remote images; the API pages are generated from the docstrings
(autodoc, Google-style sections through napoleon). Build: ``bash scripts/docs.sh``.
"""
from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import textwrap

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
# No default options: a class page lists exactly the members its ``:members:`` option names (a default of
# ``"members": False`` would override those lists and drop every method entry without a warning).
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


class _Source:
    """A default value shown as its source text (``lambda x: ...``, ``mstype.float32``), not its repr."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _constructor(cls):
    """The ``__init__`` a call of ``cls`` runs: the first one defined along the MRO, or None for object's."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return None if klass is object else vars(klass)["__init__"]
    return None


def _source_defaults(func) -> dict:
    """Parameter name -> the source text of its default, read from the ``def`` of ``func`` ({} if the source
    cannot be read)."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
        node = ast.parse(source).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return {}
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    args = node.args
    positional = args.posonlyargs + args.args
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    pairs += [(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is not None]
    return {arg.arg: ast.get_source_segment(source, default) for arg, default in pairs}


def class_signature(cls) -> str:
    """The signature a call of ``cls`` takes: its ``__init__``'s without ``self``, without annotations, with
    each default as written in the source (MindSpore's defaults, as the user would type them).

    Autodoc would show ``(*args, **kwargs)`` for every ``mindspore.nn.Cell`` subclass: it prefers a
    ``__new__`` to ``__init__``, and ``Cell`` defines ``__new__(cls, *args, **kwargs)``.
    """
    init = _constructor(cls)
    if init is None:
        return "()"
    signature = inspect.signature(init)
    texts = _source_defaults(init)
    params = []
    for param in list(signature.parameters.values())[1:]:  # without self
        default = param.default
        if default is not param.empty:
            default = _Source(texts.get(param.name) or repr(default))
        params.append(param.replace(annotation=param.empty, default=default))
    return str(signature.replace(parameters=params, return_annotation=signature.empty))


def _class_signature(app, what, name, obj, options, signature, return_annotation):
    """``autodoc-process-signature``: every class shows :func:`class_signature`."""
    if what == "class" and inspect.isclass(obj):
        return class_signature(obj), None
    return None


def setup(app):
    app.connect("autodoc-process-docstring", _plain_section_headings, priority=100)
    app.connect("autodoc-process-signature", _class_signature)
