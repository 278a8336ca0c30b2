"""Every name a benchmark script imports from a sibling module in benchmarks/ exists there (checked statically, without
importing torch 30 times): benchmarks/fuzz.py imported `HANG_SECONDS` from `codec` for months after it moved to
`_codec_fuzz`, and nothing in the suite noticed."""

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_every_name_imported_from_a_sibling_benchmark_module_exists():
    siblings = {p.stem: p for p in BENCH.glob("*.py")}
    missing = []
    for script in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in siblings:
                have = defined_names(siblings[node.module])
                missing += [f"{script.name}: {node.module}.{a.name}" for a in node.names
                            if a.name != "*" and a.name not in have]
    assert not missing, missing
