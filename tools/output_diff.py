"""Key-by-key comparison of two command outputs (JSON values and pandas tables), for
``same_outputs.py``: the first path where they differ, with both values."""

from __future__ import annotations

from typing import Any


def first_difference(a: Any, b: Any, key: str = "", added: list[str] | None = None) -> str | None:
    """The first key path where ``a`` and ``b`` differ, with both values; None when equal.

    A JSON key only ``b`` has is an addition, which the SPEC allows ("add keys freely"): it is
    appended to ``added`` (when given) instead of being a difference."""
    import pandas as pd

    if isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame):
        return _frame_difference(a, b, key)
    if type(a) is not type(b) and not (_is_num(a) and _is_num(b)):
        return f"{key or '<root>'}: {_short(a)} != {_short(b)}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            path = f"{key}.{k}" if key else str(k)
            if k not in b:
                return f"{path}: missing after"
            if k not in a:
                if added is None:
                    return f"{path}: missing before"
                added.append(path)
                continue
            diff = first_difference(a[k], b[k], path, added)
            if diff:
                return diff
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            diff = first_difference(x, y, f"{key}[{i}]", added)
            if diff:
                return diff
        if len(a) != len(b):
            return f"{key}: length {len(a)} != {len(b)}"
        return None
    if a != b and not (a != a and b != b):  # NaN equals NaN here
        return f"{key or '<root>'}: {_short(a)} != {_short(b)}"
    return None


def _is_num(x: Any) -> bool:
    """Ints and floats compare with each other (1 == 1.0); bools do not."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _frame_difference(a: Any, b: Any, key: str) -> str | None:
    """Row-order-free equality of two tables: same columns, dtypes and sorted rows.

    Values are compared first (categoricals as their values, so a column that changed only its
    dtype sorts the same), then dtypes: "dtype ... (values equal)" says only the type moved."""
    if list(a.columns) != list(b.columns):
        gone = [c for c in a.columns if c not in b.columns]
        new = [c for c in b.columns if c not in a.columns]
        return f"{key} columns: removed {gone}, added {new}, or reordered"
    if len(a) != len(b):
        return f"{key}: {len(a)} rows != {len(b)} rows"
    cols = list(a.columns)
    va, vb = _plain(a), _plain(b)
    try:
        va = va.sort_values(cols, kind="mergesort").reset_index(drop=True)
        vb = vb.sort_values(cols, kind="mergesort").reset_index(drop=True)
    except TypeError:  # unsortable cells (lists, mixed types): compare in written order
        va, vb = va.reset_index(drop=True), vb.reset_index(drop=True)
    for c in cols:
        if not va[c].equals(vb[c]):
            bad = va[c].ne(vb[c]) & ~(va[c].isna() & vb[c].isna())
            if bad.any():
                i = int(bad.to_numpy().nonzero()[0][0])
                return f"{key}[{c}] row {i}: {_short(va[c].iloc[i])} != {_short(vb[c].iloc[i])}"
    for c in cols:
        if a[c].dtype != b[c].dtype:
            return f"{key}[{c}] dtype: {a[c].dtype} != {b[c].dtype} (values equal)"
    return None


def _plain(df: Any) -> Any:
    """``df`` with categorical columns as object columns of their values."""
    cats = [c for c in df.columns if str(df[c].dtype) == "category"]
    return df.astype({c: object for c in cats}) if cats else df
