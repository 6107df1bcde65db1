//! Rows in PostgreSQL's binary `COPY … FROM STDIN` format, for bulk appends.
//!
//! `COPY` writes rows in bulk (many heap tuples per WAL record and per page
//! lock), where `INSERT … SELECT` writes them one at a time: on a 10,000-key
//! enqueue that is about a fifth less server time for the history rows and a
//! few percent for the items. Binary rather than text, so keys need no escaping.

use chrono::{DateTime, Utc};

/// The fixed header: signature, flags, header-extension length.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// The trailer: a row with field count -1.
const TRAILER: [u8; 2] = (-1_i16).to_be_bytes();

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00 UTC).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A buffer of rows under construction; [`finish`](Self::finish) yields the
/// bytes to send after `COPY … FROM STDIN (FORMAT binary)`.
#[derive(Debug)]
pub(super) struct CopyRows(Vec<u8>);

impl CopyRows {
    /// An empty buffer with room for `bytes` of rows.
    pub(super) fn with_capacity(bytes: usize) -> Self {
        let mut out = Vec::with_capacity(HEADER.len() + bytes + TRAILER.len());
        out.extend_from_slice(HEADER);
        Self(out)
    }

    /// Bytes a row takes besides its fields' contents: the field count, and a
    /// length per field.
    pub(super) const fn overhead(fields: usize) -> usize {
        2 + 4 * fields
    }

    /// Starts a row of `fields` fields (exactly that many
    /// [`field`](Self::field) calls must follow).
    pub(super) fn row(&mut self, fields: i16) -> &mut Self {
        self.0.extend_from_slice(&fields.to_be_bytes());
        self
    }

    /// A field in its binary form: a `text`'s UTF-8 bytes, or what
    /// [`int4`] and [`timestamptz`] return.
    pub(super) fn field(&mut self, bytes: &[u8]) -> &mut Self {
        // Fields are validated names (at most 1024 bytes) or fixed-size values.
        let len = i32::try_from(bytes.len()).expect("a COPY field is far below 2 GiB");
        self.0.extend_from_slice(&len.to_be_bytes());
        self.0.extend_from_slice(bytes);
        self
    }

    /// The complete data, trailer included.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&TRAILER);
        self.0
    }
}

/// An `integer` in binary form.
pub(super) fn int4(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

/// A `timestamptz` in binary form, to the microsecond (PostgreSQL's precision;
/// finer digits are dropped, as when the value is bound as a parameter).
pub(super) fn timestamptz(at: DateTime<Utc>) -> [u8; 8] {
    (at.timestamp_micros() - PG_EPOCH_MICROS).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_is_header_fields_and_trailer() {
        assert_eq!(
            HEADER.len(),
            11 + 4 + 4,
            "signature, flags, extension length"
        );
        let at = DateTime::from_timestamp_micros(PG_EPOCH_MICROS + 1).expect("in range");
        let mut rows = CopyRows::with_capacity(0);
        rows.row(3)
            .field(&timestamptz(at))
            .field(b"k")
            .field(&int4(-2));
        let mut expected = HEADER.to_vec();
        expected.extend_from_slice(&[0, 3]);
        expected.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]);
        expected.extend_from_slice(&[0, 0, 0, 1, b'k']);
        expected.extend_from_slice(&[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xfe]);
        expected.extend_from_slice(&[0xff, 0xff]);
        assert_eq!(rows.finish(), expected);
    }

    #[test]
    fn times_before_2000_are_negative() {
        let at = DateTime::from_timestamp_micros(PG_EPOCH_MICROS - 1).expect("in range");
        assert_eq!(timestamptz(at), (-1_i64).to_be_bytes());
    }
}
