"""The documentation check (``scripts/check_docs.py``, run by ``bash scripts/docs.sh`` after Sphinx).

Without building the site: the checks of the sources run on the repository as it is, the checks of the built
HTML run on small pages written here (a good one passes, each defect is reported), and the signature
``docs/conf.py`` gives every public class is one the check accepts.
"""
from __future__ import annotations

import importlib.util
import inspect
import os

import pytest
from support import REPO


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _load("check_docs", os.path.join(REPO, "scripts", "check_docs.py"))
conf = _load("docs_conf", os.path.join(REPO, "docs", "conf.py"))


def _entry(entry_id: str, params, parens: bool = True) -> str:
    """A Sphinx-like signature entry with ``params`` = [(name, default text or "")]."""
    shown = ", ".join(
        f'<em class="sig-param"><span class="n"><span class="pre">{name}</span></span>'
        + (f'<span class="o"><span class="pre">=</span></span><span class="default_value"><span class="pre">'
           f'{default}</span></span>' if default else "") + "</em>" for name, default in params)
    paren = f'<span class="sig-paren">(</span>{shown}<span class="sig-paren">)</span>' if parens else ""
    return (f'<dl class="py class"><dt class="sig sig-object py" id="{entry_id}"><span class="sig-name descname">'
            f'<span class="pre">{entry_id}</span></span>{paren}</dt><dd></dd></dl>')


def _rendered(signature: str):
    """``conf.class_signature``'s text as the rendered ``(name, default text)`` pairs."""
    inner = signature.strip()[1:-1]
    if not inner:
        return []
    parts, depth, current = [], 0, ""
    for char in inner:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [tuple(s.strip() for s in (part.partition("=")[0], part.partition("=")[2])) for part in parts]


def test_the_sources_pass():
    assert check.check_sources() == []


def test_every_public_class_gets_a_signature_the_check_accepts():
    classes = [(name, obj) for name, obj in check.public_names() if inspect.isclass(obj)]
    assert {"ms_optim.nn.Lamb", "ms_optim.nn.DenseThor", "ms_optim.train_thor.ModelThor"} <= {n for n, _ in classes}
    for name, cls in classes:
        signature = conf.class_signature(cls)
        assert "*args, **kwargs" not in signature or "**kwargs" in str(inspect.signature(cls.__init__)), name
        assert check.signature_problems(name, cls, _rendered(signature)) == [], (name, signature)


def test_lamb_shows_mindspores_defaults():
    from ms_optim.nn import LARS, Lamb
    assert conf.class_signature(Lamb) == "(params, learning_rate, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0)"
    assert conf.class_signature(LARS).endswith("lars_filter=default_lars_filter)")


def test_a_good_page_passes_and_each_defect_is_reported():
    from ms_optim.nn import Lamb
    good = _rendered(conf.class_signature(Lamb))
    assert check.signature_problems("Lamb", Lamb, good) == []
    stand_in = check.signature_problems("Lamb", Lamb, [("*args", ""), ("**kwargs", "")])
    assert len(stand_in) == 1 and "stand-in" in stand_in[0]
    renamed = [("params", ""), ("lr", "")] + good[2:]
    assert "parameters" in check.signature_problems("Lamb", Lamb, renamed)[0]
    wrong_default = good[:2] + [("beta1", "0.8")] + good[3:]
    assert check.signature_problems("Lamb", Lamb, wrong_default) == [
        "Lamb: parameter 'beta1' shows the default 0.8, the object's is 0.9"]
    object_repr = good[:-1] + [("weight_decay", "<object at 0x1>")]
    assert len(check.signature_problems("Lamb", Lamb, object_repr)) == 1


def test_entries_are_read_from_the_html():
    page = _entry("ms_optim.nn.Lamb", [("params", ""), ("beta1", "0.9")]) + _entry("ms_optim.nn.LARS.optimizer", [],
                                                                                  parens=False)
    assert check.entries(page) == {"ms_optim.nn.Lamb": [("params", ""), ("beta1", "0.9")],
                                   "ms_optim.nn.LARS.optimizer": None}


def test_a_missing_page_entry_and_member_fail_the_check(tmp_path):
    api = tmp_path / "api"
    api.mkdir()
    from ms_optim.nn import LARS
    params = _rendered(conf.class_signature(LARS))
    (api / "ms_optim.nn.LARS.html").write_text(_entry("ms_optim.nn.LARS", params), encoding="utf-8")
    (api / "ms_optim.nn.Lamb.html").write_text("<html>no entry</html>", encoding="utf-8")
    problems = check.check_html(str(tmp_path))
    assert "ms_optim.nn.LARS.optimizer: listed by its page, absent from api/ms_optim.nn.LARS.html" in problems
    assert "ms_optim.nn.Lamb: api/ms_optim.nn.Lamb.html has no entry for it" in problems
    assert "ms_optim.nn.ASGD: no page api/ms_optim.nn.ASGD.html" in problems
    assert "thor.html: no displayed formula" in problems
    assert not any(p.startswith("ms_optim.nn.LARS:") for p in problems)


def test_private_module_names_in_the_text_are_found_but_not_in_links():
    page = ('<a href="../_modules/ms_optim/_thor/layers.html">[source]</a><p>see ms_optim._thor.factors and '
            'ms_optim.optim._fused</p><script>ms_optim._hidden</script>')
    assert check.private_module_mentions(page) == ["ms_optim._thor.factors", "ms_optim.optim._fused"]


@pytest.mark.parametrize("caption, missing", [
    ("2026-11-25, |machine|, ``python benchmarks/bench_thor.py``.", []),
    ("|machine|, ``python benchmarks/bench_thor.py``.", ["a date"]),
    ("2026-11-25, ``python benchmarks/bench_thor.py``.", ["|machine|"]),
    ("2026-11-25, |machine|.", ["the command"]),
])
def test_a_figure_caption_must_carry_its_source(caption, missing):
    text = f"Text.\n\n.. figure:: ../benchmarks/results/x.png\n   :width: 90%\n\n   {caption}\n\nMore.\n"
    problems = check.figure_problems(os.path.join(REPO, "docs", "x.rst"), text)
    assert problems == ([f"docs/x.rst: the caption of ../benchmarks/results/x.png lacks {', '.join(missing)}"]
                        if missing else [])
    image = check.figure_problems(os.path.join(REPO, "docs", "x.rst"), ".. image:: a.png\n   :width: 80%\n")
    assert len(image) == 1 and "is an image" in image[0]


def test_a_record_replots_stamped_with_its_source(tmp_path):
    import shutil

    replot = _load("replot", os.path.join(REPO, "benchmarks", "replot.py"))
    common = importlib.import_module("benchmarks._common")
    source = os.path.join(REPO, "benchmarks", "results", "bench_step.json")
    copy = tmp_path / "bench_step.json"
    shutil.copy(source, copy)
    record = common.read_json(str(copy))
    assert replot.benchmark_of(record, str(copy)) == "bench_step"
    assert replot.replot(str(copy)) == [str(tmp_path / "bench_step.png")]
    assert (tmp_path / "bench_step.png").stat().st_size > 0
    stamp = common.source_stamp(record)
    assert record["utc"][:10] in stamp and "bench_step.py" in stamp and "MindSpore" in stamp
