-- name: job_row_columns
-- SPEC R0: the columns of a JobRow, in the order rows.job_row reads them, shared by every
-- statement that returns one ({job_row_columns} in job_get and job_list), over the job
-- row `j` and `r.doc`, its to_jsonb (a lateral subquery of the statement: computed once a
-- row). Columns of migration 0010 and later are read from r.doc, so a producer on a schema
-- not yet migrated still reads its jobs (NULL there); the 14th column stands where an
-- earlier listing had unique_key. DS5: the recorded steps, [name, at, kind, until] in the
-- order the handler calls them (a probe of job_step's primary key). The payload and the meta
-- as text, read by queue.job.read_payload: a row no json reader reads is shown, never an error.
j.id, j.topic, j.payload::text AS payload, j.state, j.attempts, j.priority, j.available_at, j.locked_by,
j.locked_until, j.last_error, j.idempotency_key, j.created_at, j.updated_at,
NULL::text AS unique_key, r.doc -> 'parents' AS parents,
r.doc -> 'result' AS result, r.doc -> 'errors' AS errors, r.doc -> 'progress' AS progress,
r.doc ->> 'progress_note' AS progress_note, (r.doc -> 'meta')::text AS meta,
(r.doc ->> 'crashes')::int AS crashes, r.doc ->> 'waiting_for' AS waiting_for,
(SELECT jsonb_agg(jsonb_build_array(s.name, s.at, s.kind, s.result -> 'until') ORDER BY s.seq)
 FROM {job_step} s WHERE s.job_id = j.id) AS steps,
r.doc ->> 'sequence' AS sequence,
r.doc ->> 'tenant' AS tenant
