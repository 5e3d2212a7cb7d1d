"""Exporters: the offline HTML report, and the recording as Parquet datasets (`zeromon export --format parquet`)."""
