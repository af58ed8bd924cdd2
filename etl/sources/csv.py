"""`csv:PATH`: CSV files read by Spark as lines, parsed in each task by pyarrow's CSV reader (`TableSource`)."""
from __future__ import annotations

import gzip
import itertools

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.data.encoding import numeric_values
from mpitrain.etl.records import BadRecords, ReadBatch, checked_batch
from mpitrain.etl.sources.table import SAMPLE, TableSource, checked_classes, describe_row, local_files

HADOOP_CODECS = (".bz2", ".xz", ".zst", ".lz4", ".snappy", ".deflate")  # Spark reads them; Python here does not


def _check_rows(files: list[str], path: str, header: bool) -> None:
    """A DataError naming the file (or `path`, for several) when no local CSV file at `path` holds a line of values
    (after its header line, with `header`): found before Spark starts, not as "0 classes" after it ran."""
    def lines(name: str) -> int:  # non-empty lines, up to 2
        if name.endswith(HADOOP_CODECS):
            return 2
        with (gzip.open if name.endswith(".gz") else open)(name, "rt", encoding="utf-8", errors="replace") as f:
            return len(list(itertools.islice((line for line in f if line.strip()), 2)))
    found = [lines(name) for name in files]
    if files and max(found) <= int(header):
        what = "only a header line" if max(found) else "empty"
        raise DataError(f"{files[0]}: no data rows ({what}); expected rows of values" if len(files) == 1 else
                        f"{path}: no data rows in its {len(files)} files ({what}); expected rows of values")


class CsvSource(TableSource):
    """CSV with label columns (`--label`, default the first) and numeric features, or a table's columns, or bag
    columns (`--bag`: values separated by `--bag-delimiter` in a cell) beside numeric features; `--no-header` without
    names (columns `_c0`, `_c1`, ...).

    Spark reads the files as lines (splitting large files across tasks); each task parses its Arrow batch of
    lines at once with pyarrow's C++ CSV reader, numbers as float64 and text columns (categorical ones, text
    labels) as strings. Lines with too few or too many fields are bad records. An empty field is missing. Text
    where a number belongs makes the block parse again with every column as text, to find the records it is in.
    """

    scheme, usage = "csv", "csv:PATH (file, folder or glob; label columns, numeric and categorical features)"

    def _inspect_local(self):
        files = local_files(self.paths["train"])
        if not files:
            raise DataError(f"{self.spec}: no files at {self.paths['train']}")
        for split, path in self.paths.items():
            _check_rows(files if split == "train" else local_files(path), path, self.options.header)
        if files[0].endswith(HADOOP_CODECS):
            return None  # a codec only Hadoop's readers know: Spark reads the first lines
        opener = gzip.open if files[0].endswith(".gz") else open
        with opener(files[0], "rt", encoding="utf-8", errors="replace") as f:
            lines = list(itertools.islice((line.rstrip("\r\n") for line in f if line.strip()), SAMPLE + 1))
        return self._lines_schema(lines)

    def _inspect_spark(self, spark):
        lines = spark.read.text(self.paths["train"]).where("value != ''").limit(SAMPLE + 1).collect()
        return self._lines_schema([row.value for row in lines])

    def _lines_schema(self, lines: list[str]):
        import pyarrow as pa
        import pyarrow.csv as pcsv
        if not lines:
            raise DataError(f"{self.spec}: no lines; expected a header or rows of values")
        width = lines[0].count(",") + 1  # at least the fields; pyarrow finds how many there are
        first = pcsv.read_csv(pa.py_buffer((lines[0] + "\n").encode()),
                              read_options=pcsv.ReadOptions(autogenerate_column_names=True, use_threads=False),
                              convert_options=pcsv.ConvertOptions(column_types={f"f{i}": pa.string()
                                                                                for i in range(width)}))
        fields = [first.column(i)[0].as_py() or "" for i in range(first.num_columns)]
        self.header_line = lines[0] if self.options.header else None
        columns = [f.strip() for f in fields] if self.options.header else [f"_c{i}" for i in range(len(fields))]
        self.columns = columns
        rows = lines[1:] if self.options.header else lines
        table = self._parse(rows, {}, columns, text=True)
        return columns, {}, {name: table.column(str(columns.index(name))).to_pylist() for name in columns}

    def _resolve(self, columns, kinds, sample):
        super()._resolve(columns, kinds, sample)
        if not self.table:  # with --bag columns: the numeric --features beside them
            self.feature_shape = self._shape(len(self.features))

    def frame(self, spark, split):
        return spark.read.text(self.paths[split])

    def _parse(self, lines: list[str], malformed: dict[int, str], columns: list[str] | None = None,
               text: bool = False):
        """Lines -> a pyarrow Table of the columns used, named by their index; lines of the wrong width go to
        `malformed` (index in `lines` -> the line). Numbers are float64 unless `text`; strings stay strings."""
        import pyarrow as pa
        import pyarrow.csv as pcsv
        columns = columns or self.columns
        names = [str(i) for i in range(len(columns))]
        texts = [] if text else [*self.categorical, *self.bags]
        used = names if text else list(dict.fromkeys(str(columns.index(c))
                                                      for c in [*self.labels, *self.features, *texts]))
        strings = {str(columns.index(c)) for c in texts} if not text else set(names)
        if self.text_labels:
            strings.add(str(columns.index(self.labels[0])))

        def skip(row):
            malformed[row.number - 1] = row.text
            return "skip"

        def parse(types):
            return pcsv.read_csv(pa.py_buffer(("\n".join(lines) + "\n").encode()),
                                 read_options=pcsv.ReadOptions(column_names=names, use_threads=False),
                                 parse_options=pcsv.ParseOptions(invalid_row_handler=skip),
                                 convert_options=pcsv.ConvertOptions(column_types=types, include_columns=used,
                                                                     null_values=[""], strings_can_be_null=True))
        if not lines:
            return pa.table({name: pa.array([], pa.string()) for name in used})
        try:
            return parse({n: pa.string() if n in strings else pa.float64() for n in used})
        except pa.ArrowInvalid:  # text where a number belongs: every column as text, numbers converted later
            malformed.clear()
            return parse({n: pa.string() for n in used})

    def convert(self, split: str, batch) -> ReadBatch:
        all_lines = batch.column(0).to_pylist()
        positions = [i for i, line in enumerate(all_lines) if line and line != self.header_line]
        lines = [all_lines[i] for i in positions]
        malformed = {}  # index in `lines` -> the line
        table = self._parse(lines, malformed)
        bad = BadRecords()
        texts = list(malformed.values())
        expected = f"{len(self.columns)} {'fields' if self.table else 'numbers'} separated by commas"
        bad.add(np.arange(len(texts)), lambda i: f"{self.paths[split]}: malformed line {texts[i][:80]!r}, "
                                                 f"expected {expected}")
        parsed = np.array([p for i, p in enumerate(positions) if i not in malformed], np.int64)
        kept = [line for i, line in enumerate(lines) if i not in malformed]
        index = {name: str(self.columns.index(name)) for name in self.columns}
        labels = [table.column(index[name]) for name in self.labels]
        if self.table or self.bags:
            records = table.rename_columns([self.columns[int(n)] for n in table.column_names])

            def record(i: int) -> str:
                return repr(kept[i][:60] + ("..." if len(kept[i]) > 60 else ""))
            if self.bags:
                return self._sequence_batch(split, records, labels, bad, len(lines), record, parsed)
            return self._table_batch(split, records, labels, len(lines), bad, parsed, record)
        values = [numeric_values(table.column(index[name]), name) for name in self.features]
        x = np.column_stack([v for v, _ in values]) if values else np.zeros((len(kept), 0))
        text = np.logical_or.reduce([unparsable for _, unparsable in values]) if values else np.zeros(len(kept), bool)
        bad.add(np.flatnonzero(text), lambda i: f"{self.paths[split]}: malformed line {kept[i][:80]!r}, "
                                                f"expected {expected}")
        keep = np.flatnonzero(~text)
        first = numeric_values(labels[0], self.labels[0])[0][keep] if labels and not self.text_labels else None
        batch = checked_batch(x[keep].astype(np.float32).reshape(len(keep), *self.feature_shape),
                              [label.take(keep) for label in labels] if labels else None, self.num_classes,
                              self.paths[split], lambda i: describe_row(None if first is None else first[i], x[keep[i]]),
                              bad, self.feature_dtype, parsed[keep], self.target)
        batch.seen = len(lines)
        return batch

    def _label_texts(self, spark) -> tuple[str, ...]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from mpitrain.data.encoding import category_text
        label = str(self.columns.index(self.labels[0]))

        def distinct(batches):
            for batch in batches:
                lines = [line for line in batch.column(0).to_pylist() if line and line != self.header_line]
                values = category_text(self._parse(lines, {}).column(label).combine_chunks(), self.labels[0])
                yield pa.RecordBatch.from_arrays([pc.unique(values.drop_null())], ["value"])

        frames = [self.frame(spark, split) for split in self.splits]
        frame = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        return checked_classes(self, frame.mapInArrow(distinct, "value string").distinct())
