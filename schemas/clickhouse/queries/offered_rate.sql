-- The offered load: requests created in the window, over the time between the first and the last.
SELECT
    count() AS requests,
    round(dateDiff('millisecond', min(created), max(created)) / 1000, 3) AS window_s,
    round(count() / greatest(dateDiff('millisecond', min(created), max(created)) / 1000, 0.001), 3) AS offered_rps
FROM requests FINAL
WHERE replay_id = '' AND finished >= {since:DateTime64(3)}
