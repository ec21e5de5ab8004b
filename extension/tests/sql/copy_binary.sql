-- Binary I/O of the share types: COPY (FORMAT binary) round trip through send/recv, and
-- corrupted binary input rejected with 22P03 (or 22000 for a length the column does not
-- allow), nothing stored. recv cannot be called from SQL (it takes `internal`), so every
-- binary input here goes through COPY.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS privmatch;
RESET client_min_messages;

-- Files live in pg_regress's results directory (written and read by the server).
\getenv abs_builddir PG_ABS_BUILDDIR
\set codefile :abs_builddir '/results/privmatch_codes.bin'
\set maskfile :abs_builddir '/results/privmatch_masks.bin'
\set craftedfile :abs_builddir '/results/privmatch_crafted.bin'
\set fullfile :abs_builddir '/results/privmatch_full_size.bin'

-- Round trip: COPY TO a binary file, COPY FROM it into a second table, same text output.
CREATE TABLE bin_codes (c privmatch.iris_code_share);
CREATE TABLE bin_masks (m privmatch.iris_mask_share);
INSERT INTO bin_codes VALUES ('v1:p0:AAABAAIAAwA='), ('v1:p1:AAAAAAAAAAA='),
                         ('v1:p2://8AAP//AAD//wAAAQACAA==');
INSERT INTO bin_masks VALUES ('v1:p2:AAABAAIAAwA='), ('v1:p0://8AAP//AAD//wAAAQACAA==');
COPY bin_codes TO :'codefile' (FORMAT binary);
COPY bin_masks TO :'maskfile' (FORMAT binary);
CREATE TABLE bin_codes_copy (LIKE bin_codes);
CREATE TABLE bin_masks_copy (LIKE bin_masks);
COPY bin_codes_copy FROM :'codefile' (FORMAT binary);
COPY bin_masks_copy FROM :'maskfile' (FORMAT binary);
SELECT c FROM bin_codes_copy ORDER BY c::text;
SELECT m FROM bin_masks_copy ORDER BY m::text;
SELECT (SELECT array_agg(c::text ORDER BY c::text) FROM bin_codes)
     = (SELECT array_agg(c::text ORDER BY c::text) FROM bin_codes_copy) AS codes_same,
       (SELECT array_agg(m::text ORDER BY m::text) FROM bin_masks)
     = (SELECT array_agg(m::text ORDER BY m::text) FROM bin_masks_copy) AS masks_same;

-- share_text(party, coefficient bytes in hex): the text form of such a share.
CREATE FUNCTION pg_temp.share_text(party integer, coef_hex text) RETURNS text LANGUAGE sql AS $$
  SELECT 'v1:p' || party || ':' || translate(encode(decode(coef_hex, 'hex'), 'base64'), E'\n', '')
$$;
-- Full-size shares (as in privmatch.iris_templates: 12800 and 6400 coefficients) are stored
-- out of line (TOAST); they round-trip the same way.
CREATE TABLE full_size (c privmatch.iris_code_share(12800), m privmatch.iris_mask_share(6400));
INSERT INTO full_size SELECT
  pg_temp.share_text(1, repeat('0100ffff', 6400))::privmatch.iris_code_share,
  pg_temp.share_text(1, repeat('0200', 6400))::privmatch.iris_mask_share;
COPY full_size TO :'fullfile' (FORMAT binary);
CREATE TABLE full_size_copy (LIKE full_size);
COPY full_size_copy FROM :'fullfile' (FORMAT binary);
SELECT length(privmatch.iris_code_share_send(c)) AS code_bytes,
       length(privmatch.iris_mask_share_send(m)) AS mask_bytes,
       c::text = (SELECT c::text FROM full_size) AS code_same,
       m::text = (SELECT m::text FROM full_size) AS mask_same
FROM full_size_copy;

-- A mask share is not a code share: the kind tag in the binary form is checked (22P03).
COPY bin_codes_copy FROM :'maskfile' (FORMAT binary);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM bin_codes_copy;
COPY bin_masks_copy FROM :'codefile' (FORMAT binary);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM bin_masks_copy;

-- recv applies the column's typmod: the file holds an 8-coefficient share (22000); the
-- 4-coefficient rows before it are not kept either.
CREATE TABLE bin_code4 (c privmatch.iris_code_share(4));
COPY bin_code4 FROM :'codefile' (FORMAT binary);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM bin_code4;

-- Hand-made binary COPY files holding one row of one field.
-- copy_file(field): the file (signature, flags, header extension length, field count,
-- field length, field bytes, trailer; integers big-endian).
CREATE FUNCTION pg_temp.copy_file(field bytea) RETURNS bytea LANGUAGE sql AS $$
  SELECT '\x5047434f50590aff0d0a00'::bytea || '\x00000000'::bytea || '\x00000000'::bytea
      || '\x0001'::bytea || int4send(length(field)) || field || '\xffff'::bytea
$$;
-- write_file(path, data): writes data to a server-side file (through a large object) and
-- returns its length.
CREATE FUNCTION pg_temp.write_file(path text, data bytea) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
  lo oid := lo_from_bytea(0, data);
BEGIN
  PERFORM lo_export(lo, path);
  PERFORM lo_unlink(lo);
  RETURN length(data);
END $$;
-- copy_in(tbl, path, field): writes the file, COPYs it into tbl; 'ok' or 'SQLSTATE: message'.
CREATE FUNCTION pg_temp.copy_in(tbl text, path text, field bytea) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_temp.write_file(path, pg_temp.copy_file(field));
  EXECUTE format('COPY %I FROM %L (FORMAT binary)', tbl, path);
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- copy_file reproduces what the server writes (the field is the send bytes), so its files
-- are well formed.
COPY (SELECT c FROM bin_codes WHERE c::text = 'v1:p0:AAABAAIAAwA=') TO :'craftedfile' (FORMAT binary);
SELECT pg_read_binary_file(:'craftedfile')
       = pg_temp.copy_file('\x01000100040000000000010002000300') AS same_as_server;

-- Payload fields (little-endian): version (2 bytes), kind tag, party, n (4 bytes), 2n bytes.
CREATE TABLE crafted_codes (c privmatch.iris_code_share);
CREATE TABLE crafted_masks (m privmatch.iris_mask_share);
SELECT tbl, label, pg_temp.copy_in(tbl, :'craftedfile', decode(payload, 'hex')) AS result
FROM (VALUES ('crafted_codes', '01'), ('crafted_masks', '02')) t(tbl, tag),
     LATERAL (VALUES
       (1, 'control (valid)',      '0100' || tag || '00' || '04000000' || '0000010002000300'),
       (2, 'layout version 2',     '0200' || tag || '00' || '04000000' || '0000010002000300'),
       (3, 'layout version 0',     '0000' || tag || '00' || '04000000' || '0000010002000300'),
       (4, 'kind tag 0',           '0100' || '00' || '00' || '04000000' || '0000010002000300'),
       (5, 'kind tag 3',           '0100' || '03' || '00' || '04000000' || '0000010002000300'),
       (6, 'party 3',              '0100' || tag || '03' || '04000000' || '0000010002000300'),
       (7, 'truncated coefs',      '0100' || tag || '00' || '04000000' || '000001000200'),
       (8, 'trailing bytes',       '0100' || tag || '00' || '04000000' || '00000100020003000400'),
       (9, 'n = 3',                '0100' || tag || '00' || '03000000' || '000001000200'),
       (10, 'n = 0',               '0100' || tag || '00' || '00000000'),
       (11, 'n = 2^32 - 4',        '0100' || tag || '00' || 'fcffffff' || '0000010002000300'),
       (12, 'short header',        '0100' || tag || '00' || '0400'),
       (13, 'empty field',         '')) c(n, label, payload)
ORDER BY tbl, n;
-- Only the control rows were stored.
SELECT (SELECT count(*) FROM crafted_codes) AS codes, (SELECT count(*) FROM crafted_masks) AS masks;

-- The same, as a plain COPY: a code share file whose coefficients are cut short.
SELECT pg_temp.write_file(:'craftedfile',
         pg_temp.copy_file('\x010001010400000000000100020003'::bytea));
COPY crafted_codes FROM :'craftedfile' (FORMAT binary);
SELECT :'LAST_ERROR_SQLSTATE' AS sqlstate, count(*) FROM crafted_codes;
