"""A lake's data files as its catalog lists them: which are missing or damaged, and a DuckDB error about one
said in one line naming the file (a file deleted or overwritten under the lake breaks every read of it)."""

from __future__ import annotations

import os
import re

import duckdb

# DuckDB names the file it could not read in quotes: "Cannot open file "/x/y.parquet"", "File '/x/y.parquet' ...".
_FILE_IN_ERROR = re.compile(r"""["']([^"']+\.parquet)["']""")


def damaged_files(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The local data and delete files the catalog lists that are missing or not the size it recorded."""
    damaged = []
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                         "ORDER BY table_name").fetchall()
    for (table,) in tables:
        rows = con.execute("SELECT data_file, data_file_size_bytes, delete_file, delete_file_size_bytes "
                           "FROM ducklake_list_files(current_database(), ?)", [table]).fetchall()
        for data, data_size, deletes, deletes_size in rows:
            for path, size in ((data, data_size), (deletes, deletes_size)):
                if path and "://" not in path and (not os.path.isfile(path) or os.path.getsize(path) != size):
                    damaged.append(path)
    return damaged


def damage_message(exc: BaseException, store: str) -> str | None:
    """One line naming the lake's data file a DuckDB error is about; None when it is about no such file."""
    if not isinstance(exc, duckdb.Error):
        return None
    found = _FILE_IN_ERROR.search(str(exc))
    if found is None:
        return None
    path = found.group(1)
    state = "missing" if not os.path.exists(path) else "damaged"
    return (f"{store}: the lake is damaged: its data file {path} is {state}; restore the file, or the "
            "store from a backup")


def damaged_message(paths: list[str], store: str) -> str:
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    state = "missing" if not os.path.exists(paths[0]) else "damaged"
    return (f"{store}: the lake is damaged: its data file {paths[0]} is {state}{more}; restore the file, or the "
            "store from a backup")
