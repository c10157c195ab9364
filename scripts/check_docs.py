"""Check the documentation against the package it documents; ``bash scripts/docs.sh`` runs it after Sphinx.

Built site (``docs/_build/html``):

* every public name (the facades' export tables: ``ms_optim.nn``, ``ms_optim.train_thor``, ``ms_optim.amp``,
  ``ms_optim``) has its API page with an entry whose signature is the one ``inspect.signature`` gives
  (a class: its ``__init__`` without ``self``): the same parameters in the same order with the same
  defaults, never a stand-in ``(*args, **kwargs)``;
* every member a page lists (``:members:``) has its own entry;
* the THOR pages and the optimizers' pages render display math; no API page names a private module.

Sources (``docs/``, ``README.md``, ``benchmarks/results``), checked without a build as well:

* every public method or property a public class defines is listed on its page;
* every figure is a ``.. figure::`` whose caption gives a date, the machine and the command;
* ``benchmarks/results`` holds only the files the docs and the README cite (a JSON record counts as cited
  when a cited plot is drawn from it), and every cited file is there.

Usage: ``python scripts/check_docs.py [HTML_DIR]`` (default ``docs/_build/html``). Prints every finding
and exits with status 1 if there is one.
"""
from __future__ import annotations

import ast
import html
import importlib
import inspect
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = os.path.join(REPO, "docs")
RESULTS = os.path.join(REPO, "benchmarks", "results")
#: most specific first: a name is documented under the facade a script imports it from
FACADES = ("ms_optim.nn", "ms_optim.train_thor", "ms_optim.amp", "ms_optim")
#: methods of the Cell protocol that MindSpore calls, not the user
PROTOCOL = {"construct", "extend_repr"}
#: pages whose formulas must render as math
MATH_PAGES = ("thor.html", "api/ms_optim.nn.thor.html", "api/ms_optim.nn.Lamb.html",
              "api/ms_optim.nn.LARS.html", "api/ms_optim.nn.ASGD.html")
_EMPTY = inspect.Parameter.empty


# ----------------------------------------------------------------------------------- public names
def public_names() -> List[Tuple[str, object]]:
    """``(documented name, object)`` of every public name, each object once, under its most specific facade."""
    seen: Dict[int, Tuple[str, object]] = {}
    for facade_name in FACADES:
        facade = importlib.import_module(facade_name)
        table = {**facade._EXPORTS, **getattr(facade, "_EXTRAS", {})}  # pylint: disable=protected-access
        for name in sorted(table):
            obj = getattr(facade, name)
            seen.setdefault(id(obj), (f"{facade_name}.{name}", obj))
    return sorted(seen.values(), key=lambda item: item[0])


def constructor(cls) -> Optional[object]:
    """The ``__init__`` a call of ``cls`` runs (the first along the MRO), or None for ``object``'s."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return None if klass is object else vars(klass)["__init__"]
    return None


def user_members(cls) -> List[str]:
    """The public methods and properties ``cls`` defines itself (not the Cell protocol's)."""
    kinds = (property, staticmethod, classmethod)
    return [name for name, value in vars(cls).items()
            if not name.startswith("_") and name not in PROTOCOL
            and (inspect.isfunction(value) or isinstance(value, kinds))]


def expected_parameters(obj) -> List[Tuple[str, object]]:
    """``(name as a signature shows it, default or inspect.Parameter.empty)`` of ``obj``'s call, with the
    ``/`` and ``*`` markers where Python's signature has them."""
    if inspect.isclass(obj):
        init = constructor(obj)
        if init is None:
            return []
        params = list(inspect.signature(init).parameters.values())[1:]
    else:
        params = list(inspect.signature(obj).parameters.values())
    shown: List[Tuple[str, object]] = []
    kinds = [p.kind for p in params]
    for index, param in enumerate(params):
        if param.kind is param.KEYWORD_ONLY and param.VAR_POSITIONAL not in kinds and (
                index == 0 or params[index - 1].kind is not param.KEYWORD_ONLY):
            shown.append(("*", _EMPTY))
        prefix = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "")
        shown.append((prefix + param.name, param.default))
        if param.kind is param.POSITIONAL_ONLY and (index + 1 == len(params)
                                                    or params[index + 1].kind is not param.POSITIONAL_ONLY):
            shown.append(("/", _EMPTY))
    return shown


# ----------------------------------------------------------------------------------- built HTML
_ENTRY = re.compile(r'<dt class="sig sig-object py[^"]*"[^>]*\sid="([^"]+)"[^>]*>(.*?)</dt>', re.S)
_PARAM = re.compile(r'<em class="sig-param">(.*?)</em>', re.S)
_TAG = re.compile(r"<[^>]+>")


def _text(fragment: str) -> str:
    return " ".join(html.unescape(_TAG.sub("", fragment)).split())


def entries(page: str) -> Dict[str, Optional[List[Tuple[str, str]]]]:
    """Entry id -> its parameters ``(name, default text or "")`` as rendered (None: no parentheses)."""
    found: Dict[str, Optional[List[Tuple[str, str]]]] = {}
    for entry_id, body in _ENTRY.findall(page):
        if 'class="sig-paren"' not in body:
            found[entry_id] = None
            continue
        params = []
        for param in _PARAM.findall(body):
            name, _, default = _text(param).partition("=")
            params.append((name.strip(), default.strip()))
        found[entry_id] = params
    return found


def _same_default(expected, text: str) -> bool:
    """Whether the rendered ``text`` shows the default value ``expected``."""
    if expected is _EMPTY:
        return text == ""
    if not text or text.startswith("<"):  # missing, or an object's repr such as <function ...>
        return False
    try:
        return ast.literal_eval(text) == expected
    except (ValueError, SyntaxError, TypeError):
        return not isinstance(expected, (int, float, str, bool, tuple, type(None)))  # an expression


def signature_problems(name: str, obj, rendered: Optional[List[Tuple[str, str]]]) -> List[str]:
    """What differs between the rendered parameters of ``name`` and the object's real signature."""
    expected = expected_parameters(obj)
    shown = rendered or []
    names = [n for n, _ in shown]
    if names[-2:] == ["*args", "**kwargs"] and [n for n, _ in expected][-2:] != ["*args", "**kwargs"]:
        return [f"{name}: the page shows ({', '.join(names)}): a stand-in, not its signature"]
    if names != [n for n, _ in expected]:
        want = ", ".join(n for n, _ in expected)
        return [f"{name}: the page shows the parameters ({', '.join(names)}), the object takes ({want})"]
    return [f"{name}: parameter {n!r} shows the default {text or 'none'}, the object's is {default!r}"
            for (n, default), (_, text) in zip(expected, shown) if not _same_default(default, text)]


def listed_members(api_dir: str = os.path.join(DOCS, "api")) -> Dict[str, List[str]]:
    """Documented class name -> the members its page lists (``:members:`` under ``.. autoclass::``)."""
    listed: Dict[str, List[str]] = {}
    for file_name in sorted(os.listdir(api_dir)):
        if not file_name.endswith(".rst"):
            continue
        text = open(os.path.join(api_dir, file_name), encoding="utf-8").read()
        module = re.search(r"^\.\. (?:currentmodule|module):: (\S+)", text, re.M)
        for cls, options in re.findall(r"^\.\. autoclass:: (\S+)\n((?:[ \t]+:.*\n)*)", text, re.M):
            qualified = cls if module is None or "." in cls else f"{module.group(1)}.{cls}"
            members = re.search(r":members:(.*)", options)
            listed[qualified] = [m.strip() for m in members.group(1).split(",") if m.strip()] if members else []
    return listed


def private_module_mentions(page: str) -> List[str]:
    """The private module names (``ms_optim._thor``, ``ms_optim.optim._fused``, ...) in a page's visible text."""
    body = re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S)
    return sorted(set(re.findall(r"\bms_optim(?:\.[a-z]\w*)*\._\w+(?:\.\w+)*", _text(body))))


def check_html(html_dir: str) -> List[str]:
    """The findings in the built site ``html_dir`` (see the module docstring)."""
    problems: List[str] = []
    listed = listed_members()
    for name, obj in public_names():
        path = os.path.join(html_dir, "api", name + ".html")
        if not os.path.exists(path):
            problems.append(f"{name}: no page api/{name}.html")
            continue
        found = entries(open(path, encoding="utf-8").read())
        if name not in found:
            problems.append(f"{name}: api/{name}.html has no entry for it")
            continue
        if callable(obj):
            problems += signature_problems(name, obj, found[name])
        for member in listed.get(name, []):
            if f"{name}.{member}" not in found:
                problems.append(f"{name}.{member}: listed by its page, absent from api/{name}.html")
    for page in MATH_PAGES:
        path = os.path.join(html_dir, page)
        if not os.path.exists(path) or '<div class="math' not in open(path, encoding="utf-8").read():
            problems.append(f"{page}: no displayed formula")
    api_dir = os.path.join(html_dir, "api")
    for file_name in sorted(os.listdir(api_dir)) if os.path.isdir(api_dir) else []:
        if file_name.endswith(".html"):
            for module in private_module_mentions(open(os.path.join(api_dir, file_name), encoding="utf-8").read()):
                problems.append(f"api/{file_name}: names the private module {module}")
    return problems


# ----------------------------------------------------------------------------------- sources
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_COMMAND = re.compile(r"``(?:nice )?(?:python|bash|MS_OPTIM_\w+=\S+ python) [^`]+``")


def figures(text: str) -> List[Tuple[str, str, str]]:
    """``(directive, target, caption)`` of every ``image``/``figure`` directive in reST ``text``."""
    found = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)\.\. (image|figure):: (\S+)", line)
        if not match:
            continue
        indent, body = len(match.group(1)), []
        for following in lines[index + 1:]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following.strip())
        caption = " ".join(" ".join(b for b in body if not b.startswith(":")).split())
        found.append((match.group(2), match.group(3), caption))
    return found


def figure_problems(path: str, text: str) -> List[str]:
    """Every plot of a reST file is a figure whose caption has a date, ``|machine|`` and a command."""
    problems = []
    where = os.path.relpath(path, REPO)
    for directive, target, caption in figures(text):
        if directive == "image":
            problems.append(f"{where}: {target} is an image: make it a figure with a caption (date, machine, "
                            f"command)")
            continue
        missing = [what for what, ok in (("a date", _DATE.search(caption)), ("|machine|", "|machine|" in caption),
                                         ("the command", _COMMAND.search(caption))) if not ok]
        if missing:
            problems.append(f"{where}: the caption of {target} lacks {', '.join(missing)}")
    return problems


def _cited_texts() -> List[Tuple[str, str]]:
    paths = [os.path.join(REPO, "README.md")]
    paths += [os.path.join(folder, f) for folder, _, files in os.walk(DOCS) if "_build" not in folder
              for f in files if f.endswith(".rst")]
    return [(p, open(p, encoding="utf-8").read()) for p in sorted(paths)]


def results_problems(results_dir: str = RESULTS) -> List[str]:
    """``results_dir`` holds exactly the files the docs and README cite, plus each cited plot's JSON."""
    texts = _cited_texts()
    cited = set()
    for _, text in texts:
        cited.update(re.findall(r"\b(bench_\w+\.(?:json|png))\b", text))
    present = set(os.listdir(results_dir)) if os.path.isdir(results_dir) else set()
    problems = [f"benchmarks/results/{name}: cited by the docs or README, but not there"
                for name in sorted(cited - present)]
    plots = {name[:-4] for name in cited if name.endswith(".png")}
    for name in sorted(present - cited):
        stem, ext = os.path.splitext(name)
        source = ext == ".json" and any(plot == stem or plot.startswith(stem + "_") for plot in plots)
        if not source:
            problems.append(f"benchmarks/results/{name}: cited nowhere in docs/ or README.md (git keeps it)")
    return problems


def check_sources() -> List[str]:
    """The findings in the sources (see the module docstring); needs no build."""
    problems: List[str] = []
    listed = listed_members()
    for name, obj in public_names():
        if not os.path.exists(os.path.join(DOCS, "api", name + ".rst")):
            problems.append(f"{name}: no page docs/api/{name}.rst")
        if inspect.isclass(obj):
            for member in user_members(obj):
                if member not in listed.get(name, []):
                    problems.append(f"{name}.{member}: a public member the page does not list (:members:)")
    for path, text in _cited_texts():
        if path.endswith(".rst"):
            problems += figure_problems(path, text)
    return problems + results_problems()


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    html_dir = os.path.abspath(argv[0] if argv else os.path.join(DOCS, "_build", "html"))
    if not os.path.isdir(html_dir):
        print(f"[docs check] no built site at {html_dir}: run bash scripts/docs.sh", file=sys.stderr)
        return 1
    problems = check_sources() + check_html(html_dir)
    for problem in problems:
        print(f"[docs check] {problem}")
    print(f"[docs check] {len(public_names())} public names, {len(problems)} finding(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    sys.exit(main())
