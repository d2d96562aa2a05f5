"""Analysis of ursa-ray results: reads only the Parquet files of a results directory."""
