-- privmatch pgbench load tests: the staging table, the outcomes and the one step every
-- pgbench script runs; created by the application login itself (no privilege beyond
-- privmatch_application and its own schema).
--
-- A step takes the next unused sealed input of its kind (FOR UPDATE SKIP LOCKED: concurrent
-- clients never take the same one; marked used in the step's own transaction), calls the
-- front-door function, and records the outcome: ok with the function's answer, or the
-- SQLSTATE and message of its error. Errors are recorded rather than raised so that a load
-- run goes on through faults (pgbench ends a client at its first error that is not a
-- serialization failure); the runner reports them. An exhausted staging table raises: the
-- runner sealed too few inputs for the level, and the level is invalid.
DROP TABLE IF EXISTS privmatch_bench.outcomes, privmatch_bench.inputs, privmatch_bench.staged;
-- Where the runner copies a file of sealed inputs before giving them their kind and level (a
-- table of the schema, not a temporary one: logins may not create temporary tables).
CREATE UNLOGGED TABLE privmatch_bench.staged (subject text, sealed text);
CREATE TABLE privmatch_bench.inputs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind    text    NOT NULL,
    level   integer NOT NULL,
    subject text    NOT NULL,
    sealed  text    NOT NULL,
    used    boolean NOT NULL DEFAULT false
);
CREATE INDEX inputs_unused ON privmatch_bench.inputs (kind, level, id) WHERE NOT used;
CREATE TABLE privmatch_bench.outcomes (
    input    bigint  PRIMARY KEY REFERENCES privmatch_bench.inputs (id),
    kind     text    NOT NULL,
    level    integer NOT NULL,
    ok       boolean NOT NULL,
    answer   text,
    sqlstate text,
    message  text,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- For a failed enrolment, what calling again with the same input found (resolve()).
    resolved text
);

CREATE OR REPLACE FUNCTION privmatch_bench.step(step_kind text, step_level integer)
RETURNS text LANGUAGE plpgsql AS $step$
DECLARE
    chosen privmatch_bench.inputs%ROWTYPE;
    result text;
BEGIN
    UPDATE privmatch_bench.inputs SET used = true
     WHERE id = (SELECT id FROM privmatch_bench.inputs
                  WHERE kind = step_kind AND level = step_level AND NOT used
                  ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING * INTO chosen;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'privmatch_bench: no unused % input left for level %', step_kind, step_level;
    END IF;
    BEGIN
        result := CASE step_kind
            WHEN 'iris-enroll'     THEN privmatch.iris_enroll(chosen.sealed)::text
            WHEN 'iris-identify'   THEN (SELECT count(*) FROM privmatch.iris_identify(chosen.sealed))::text
            WHEN 'iris-uniqueness' THEN privmatch.iris_is_unique(chosen.sealed)::text
            WHEN 'face-enroll'     THEN privmatch.face_enroll(chosen.sealed)::text
            WHEN 'face-verify'     THEN privmatch.face_verify(chosen.subject, chosen.sealed)::text
            WHEN 'face-identify'   THEN (SELECT count(*) FROM privmatch.face_identify(chosen.sealed))::text
        END;
        INSERT INTO privmatch_bench.outcomes (input, kind, level, ok, answer)
        VALUES (chosen.id, step_kind, step_level, true, result);
    EXCEPTION WHEN OTHERS THEN
        INSERT INTO privmatch_bench.outcomes (input, kind, level, ok, sqlstate, message)
        VALUES (chosen.id, step_kind, step_level, false, SQLSTATE, SQLERRM);
        result := 'error ' || SQLSTATE;
        -- An application backs off after an error; without this a client would drain the
        -- staging table in a tight loop while a party or the coordinator is down.
        PERFORM pg_sleep(0.05);
    END;
    RETURN result;
END
$step$;

-- After a run with faults: learns the outcome of every enrolment whose call failed, as
-- docs/front-door.md tells an application to: the same sealed input is sent again; 23505
-- ("already consumed") means the first call committed, true means it had not and is enrolled
-- now. Returns how many of each.
CREATE OR REPLACE FUNCTION privmatch_bench.resolve()
RETURNS TABLE (resolution text, how_many bigint) LANGUAGE plpgsql AS $resolve$
DECLARE
    failed record;
    enrolled_now boolean;
    failure text;
BEGIN
    FOR failed IN
        SELECT o.input, o.kind, i.sealed FROM privmatch_bench.outcomes o
          JOIN privmatch_bench.inputs i ON i.id = o.input
         WHERE NOT o.ok AND o.kind IN ('iris-enroll', 'face-enroll') AND o.resolved IS NULL
         ORDER BY o.input
    LOOP
        BEGIN
            IF failed.kind = 'iris-enroll' THEN
                enrolled_now := privmatch.iris_enroll(failed.sealed);
            ELSE
                enrolled_now := privmatch.face_enroll(failed.sealed);
            END IF;
            UPDATE privmatch_bench.outcomes
               SET resolved = CASE WHEN enrolled_now THEN 'enrolled-now' ELSE 'already-enrolled' END
             WHERE input = failed.input;
        EXCEPTION
            WHEN unique_violation THEN
                UPDATE privmatch_bench.outcomes SET resolved = 'committed-before'
                 WHERE input = failed.input;
            WHEN OTHERS THEN
                -- Through a variable: inside the UPDATE, SQLSTATE would name the column.
                failure := SQLSTATE;
                UPDATE privmatch_bench.outcomes SET resolved = 'error ' || failure
                 WHERE input = failed.input;
        END;
    END LOOP;
    RETURN QUERY SELECT o.resolved, count(*) FROM privmatch_bench.outcomes o
                  WHERE o.resolved IS NOT NULL GROUP BY o.resolved ORDER BY o.resolved;
END
$resolve$;
