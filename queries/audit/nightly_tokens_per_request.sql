-- returns: one row per row of a vLLM nightly summary table that gives both throughputs,
--   loaded as nightly_rows(row_index, row_name, request_throughput, output_throughput):
--   output_tokens_per_request = Output Tput (tok/s) / Tput (req/s) (a row with Tput <= 0 or
--   no output throughput is left out), and relative_spread = (max - min) / max of that
--   figure over the rows (NULL when the largest is 0: no tokens to compare).
-- units: output_tokens_per_request tokens per request; relative_spread a fraction.
WITH per_row AS (
    SELECT row_index, row_name, output_throughput / request_throughput AS output_tokens_per_request
    FROM nightly_rows
    WHERE request_throughput > 0 AND output_throughput IS NOT NULL
)
SELECT
    row_index,
    row_name,
    output_tokens_per_request,
    (max(output_tokens_per_request) OVER () - min(output_tokens_per_request) OVER ())
        / nullif(max(output_tokens_per_request) OVER (), 0) AS relative_spread
FROM per_row
ORDER BY row_index;
