-- The search round functions validate their arguments before contacting the engine, and
-- report an engine that is not running (this throwaway cluster does not preload privmatch)
-- with 55000 and a hint, at once.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;
\set VERBOSITY default

SELECT state, templates, sessions FROM privmatch.engine_status();

-- Session ids are 16 bytes (22023, naming the function).
SELECT * FROM privmatch.iris_search_start('\x0102'::bytea, '\x00'::bytea);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT * FROM privmatch.iris_search_round('\x00'::bytea, 0, '\x00'::bytea);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT privmatch.iris_search_abort(''::bytea);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Rounds count from 0.
SELECT * FROM privmatch.iris_search_round(decode(repeat('00', 16), 'hex'), -1, '\x00'::bytea);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;

-- Well-formed arguments, no engine: 55000 with a hint, nothing written. (The search's mode,
-- rotation range and threshold travel only sealed in the probe: the engine checks them.)
SELECT * FROM privmatch.iris_search_start(decode(repeat('00', 16), 'hex'), '\x00'::bytea);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate;
SELECT count(*) AS templates FROM privmatch.iris_templates;
