"""The docs' measured tables, refilled from the saved reports they come from (`python -m tinyspec
figures tables`), each with the machine that measured it on the line below: "*Measured on: AMD EPYC
(AVX2), 1 thread.*", read from the report's own record of its device. tests/test_docs.py checks every
cell and every machine line against the report independently."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..methods.draft import expected_tokens

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout: tinyspec/bench/ is two below it


# A table from the saved benchmark: `<!-- bench: FILE key=value ... columns=c1,c2,... -->` on the line
# before it. A column is a key (method, T, category), a field of FILE's rows, `field[code/docs/structured]`
# (one cell per category, joined by "/"), tau_from_alpha (Leviathan's tau from the row's alpha),
# or - (not from FILE). Options: T=, category=, method= fix a key; prefix=draft: completes the method
# cells (`4` is draft:4, `ar` stays); source=huggingface reads FILE's Hugging Face rows; rows=all
# (every row of FILE that the fixed keys and the prefix select, `ar` only without a prefix).
# key=FIELD: a curve, not a benchmark: each row of the table is FILE's row whose FIELD is the
# table's cell in the column of that name (`key=tokens columns=tokens,plain_steps`); several
# fields, comma-separated, name a row together (`key=L,T` for the kernel's shapes).
# Under the table, after a blank line (a line right below a table's rows would read as one more row),
# the machine line: `*Measured on: DEVICE.*`, DEVICE as FILE records it (`machine`).
BENCH_TABLE = re.compile(r"^<!-- bench: (\S+)((?: \w+=\S+)*) -->\n((?:\|.*\n)+)(?:\n\*Measured on: .*\*\n)?", re.M)
DECIMALS = {"tau": 2, "tau_from_alpha": 2, "predicted_tau": 2, "speedup": 2, "predicted_speedup": 2, "step_cost": 2,
            "acceptance_rate": 3, "alpha": 3, "tokens_per_s": 0, "same_as_ar": 0, "tinyspec_speedup": 2,
            "matches_tinyspec": 2, "same_as_tinyspec": 0}
KEYS = ("method", "T", "category", "shape", "size")


def bench_value(row: dict | None, field: str):
    if row is None:
        return None
    if field == "tau_from_alpha":
        alpha, k = row.get("alpha"), row["method"].partition(":")[2].partition("@")[0]
        return None if alpha is None else expected_tokens(alpha, int(k))
    return row.get(field)


def group(row: dict) -> str:
    """What a table's per-cell columns (`tau[code/docs/structured]`) range over: a benchmark row's
    category, a batch curve's batch size (`speedup[1/2/4/8/16]`), or the shape a sizing row measured."""
    return str(row.get("category", row.get("batch_size", row.get("shape", row.get("size")))))


def fill_table(options: dict, header: list[str], rows: list[list[str]], root: Path) -> list[list[str]]:
    """The table's rows with every value cell recomputed from the saved report (decimals as printed)."""
    report = json.loads((root / options["path"]).read_text())
    saved = report[options.get("source", "rows")]
    columns = options["columns"].split(",")
    if "key" in options:  # a curve: rows named by their values of the key fields, every other column a field of that row
        keys = options["key"].split(",")
        out = []
        for cells in rows:
            shown = {key: cells[columns.index(key)].strip("`") for key in keys}
            row = next((r for r in saved if all(f"{r[k]:g}" == f"{float(shown[k]):g}" for k in keys)), {})
            out.append([cell if column in keys or column == "-" else "-" if row.get(column) is None else
                        f"{row[column]:.{len(cell.partition('.')[2]) if re.fullmatch(r'-?[0-9.]+', cell) else 2}f}"
                        for column, cell in zip(columns, cells)])
        return out
    fixed = {k: options[k] for k in KEYS if k in options}
    prefix = options.get("prefix", "")
    if options.get("rows") == "all":
        keys = [c for c in columns if c in KEYS]
        seen = {}
        for r in saved:
            row_key = {"method": r["method"], "T": f"{r['temperature']:g}", "category": group(r), "shape": group(r),
                       "size": group(r)}
            if all(row_key[k] == v for k, v in fixed.items()) and r["method"].startswith(prefix):
                seen.setdefault(tuple(row_key[k] for k in keys), None)
        rows = [[(dict(zip(keys, key))[c].removeprefix(prefix) if c in KEYS else "") for c in columns] for key in seen]
        rows = [[f"`{c}`" if col == "method" and c and not prefix else c for c, col in zip(row, columns)] for row in rows]
    out = []
    for cells in rows:
        key = dict(fixed, **{c: cell.strip("`") for c, cell in zip(columns, cells) if c in KEYS})
        method = key["method"] if key["method"] == "ar" else prefix + key["method"]

        def find(category):
            match = [r for r in saved if r["method"] == method and f"{r['temperature']:g}" == f"{float(key['T']):g}"
                     and group(r) == category]
            return match[0] if match else None
        new = []
        for column, cell in zip(columns, cells):
            field, _, per = column.partition("[")
            if column in KEYS or column == "-":
                new.append(cell)
                continue
            categories = per.rstrip("]").split("/") if per else [key.get("category", key.get("shape"))]
            olds = re.split(r"\s*/\s*", cell) if per else [cell]
            joiner = " / " if " / " in cell else "/"  # the README spaces them; the book's wide tables do not
            parts = []
            for category, old in zip(categories, olds + [""] * len(categories)):
                value = bench_value(find(category), field)
                shown = old.strip("`* x")
                decimals = len(shown.partition(".")[2]) if re.fullmatch(r"-?[0-9.]+", shown) else DECIMALS.get(field, 2)
                parts.append("-" if value is None else f"{value:.{decimals}f}")
            new.append(joiner.join(parts))
        out.append(new)
    return out


def machine(report: dict, path: str) -> str:
    """The machine a saved report was measured on, as the report records it: a GPU's name, or a
    CPU's model and instruction set with its threads (`sizing.device_name`, as `bench` writes it)."""
    device = report.get("device")
    if not isinstance(device, str) or not device or device.startswith("cpu"):
        raise ValueError(f"{path} does not record the machine it was measured on (its device is {device!r}): "
                         "measure it again with the command it records, which now records the CPU or GPU")
    threads = report.get("threads")
    if threads and "thread" not in device:
        device += f", {threads} thread{'s' * (threads > 1)}"
    return device


def machine_line(path: str, root: Path = ROOT) -> str:
    """The line under a table of FILE: `*Measured on: AMD EPYC (AVX2), 1 thread.*`."""
    return f"*Measured on: {machine(json.loads((root / path).read_text()), path)}.*"


def fill_tables(text: str, root: Path = ROOT) -> str:
    """Every marked table of a document refilled from the report its marker names, with the machine
    line under it (ValueError: a report that does not record its machine)."""
    def refill(m):
        options = dict(o.split("=", 1) for o in m.group(2).split())
        options["path"] = m.group(1)
        lines = m.group(3).splitlines()
        rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]
        body = ["| " + " | ".join(r) + " |" for r in fill_table(options, lines[0], rows, root)]
        after = "" if m.string[m.end():m.end() + 1] in ("", "\n") else "\n"  # a blank line before the prose
        return (m.group(0)[: m.start(3) - m.start(0)] + "\n".join(lines[:2] + body) + "\n\n"
                + machine_line(options["path"], root) + "\n" + after)
    return BENCH_TABLE.sub(refill, text)




# A figure drawn from a measurement: its image line, then its caption ending `Measured on: MACHINE.*`,
# MACHINE that of the JSON beside the PNG (a worked example's) or else of the report the caption cites.
CAPTION = re.compile(r"^!\[[^\]\n]*\]\(([^)\n]+\.png)\)\n(\*Figure [^\n]*?)Measured on: [^\n]*?\.\*$", re.M)


def fill_captions(text: str, folder: Path, root: Path = ROOT) -> str:
    """Every measured figure's caption of a document in `folder` with the machine its report records."""
    def refill(m):
        beside = (folder / m.group(1)).with_suffix(".json")
        cited = re.findall(r"`(docs/[\w/]+\.json)`", m.group(2))
        path = beside if beside.is_file() else root / cited[0] if cited else None
        if path is None:
            raise ValueError(f"the caption of {m.group(1)} cites no saved report (`docs/....json`) to read its machine from")
        report = json.loads(path.read_text())
        return m.group(0)[:m.start(2) - m.start(0)] + f"{m.group(2)}Measured on: {machine(report, str(path))}.*"
    return CAPTION.sub(refill, text)
