//! Writing answers into the reply: a found vector converted into the asked
//! form (words, roaring or count) straight into the message, or a
//! [`Failure`] as the DBMS interface's error.

use bitfold_engine::fold::Term;
use bitfold_engine::{VectorPart, portable, words};
use capnp::capability::Response;

use crate::bitfold_capnp::{Format as WireFormat, coordinate_result, fetch_result, result, slave};
use crate::wire::{self, PartList};
use bitfold_proto::ErrorKind;

/// The most bytes one Cap'n Proto `Data` holds: the limit of a `words` or
/// `roaring` answer.
pub const MAX_DATA_BYTES: usize = (1 << 29) - 1;

/// An error answer for the DBMS.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) kind: ErrorKind,
    pub(super) message: String,
    pub(super) failed_machines: Vec<String>,
}

impl Failure {
    pub(super) fn new(kind: ErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            failed_machines: Vec::new(),
        }
    }

    pub(super) fn internal(err: impl std::fmt::Display) -> Failure {
        Failure::new(ErrorKind::Internal, err.to_string())
    }

    pub(super) fn write(&self, mut error: crate::bitfold_capnp::error::Builder<'_>) {
        error.set_kind(self.kind.to_wire());
        error.set_message(self.message.as_str());
        let mut list = error.init_failed_machines(self.failed_machines.len() as u32);
        for (i, name) in self.failed_machines.iter().enumerate() {
            list.set(i as u32, name.as_str());
        }
    }
}

/// A found vector (or its count), still in the reply it came in.
pub(super) enum Found {
    Empty,
    Range(Response<slave::coordinate_results::Owned>),
    Point(Response<slave::fetch_results::Owned>),
}

/// Writes what was found (the pieces of one answer, key-disjoint and in
/// ascending order) into the reply, in `format`: counts add up, vectors
/// join by concatenation.
pub(super) fn write_found(
    found: &[Found],
    format: WireFormat,
    out: result::Builder<'_>,
) -> Result<(), Failure> {
    let mut lists: Vec<PartList<'_>> = Vec::new();
    let mut counted = None;
    for piece in found {
        match piece {
            Found::Empty => {}
            Found::Range(response) => {
                match response
                    .get()
                    .and_then(|r| r.get_result())
                    .and_then(|r| Ok(r.which()?))
                {
                    Ok(coordinate_result::Vector(list)) => {
                        lists.push(list.map_err(Failure::internal)?);
                    }
                    Ok(coordinate_result::Count(count)) => {
                        counted = Some(counted.unwrap_or(0) + count);
                    }
                    Ok(coordinate_result::FailedMachines(_)) => {
                        return Err(Failure::internal("a failed answer was taken for a vector"));
                    }
                    Err(err) => return Err(Failure::internal(err)),
                }
            }
            Found::Point(response) => {
                match response
                    .get()
                    .and_then(|r| r.get_result())
                    .and_then(|r| Ok(r.which()?))
                {
                    Ok(fetch_result::Vector(list)) => lists.push(list.map_err(Failure::internal)?),
                    Ok(fetch_result::Count(count)) => {
                        counted = Some(counted.unwrap_or(0) + count);
                    }
                    Ok(fetch_result::NotFound(())) => {
                        return Err(Failure::internal("a missing vector was taken for one"));
                    }
                    Err(err) => return Err(Failure::internal(err)),
                }
            }
        }
    }
    if let Some(count) = counted {
        if !lists.is_empty() {
            return Err(Failure::internal(
                "pieces of one answer came as counts and as vectors",
            ));
        }
        return write_count(count, format, out);
    }
    let wire_parts = lists
        .into_iter()
        .map(|list| wire::read_partial(list, &mut wire::HoleBudget::per_message()))
        .collect::<capnp::Result<Vec<_>>>()
        .map_err(Failure::internal)?;
    let mut parts = Vec::new();
    for piece in &wire_parts {
        parts.extend(wire::views(piece).map_err(Failure::internal)?);
    }
    // The forms below need key-disjoint ascending parts: check, never panic.
    Term::new(&parts).map_err(Failure::internal)?;
    write_vector(&parts, format, out)
}

fn write_count(
    count: u64,
    format: WireFormat,
    mut out: result::Builder<'_>,
) -> Result<(), Failure> {
    if format != WireFormat::Count {
        return Err(Failure::internal(
            "a count was answered where a vector was asked",
        ));
    }
    out.set_count(count);
    Ok(())
}

/// Converts `parts` (key-disjoint, ascending) into `format`, straight into the reply.
fn write_vector(
    parts: &[VectorPart<'_>],
    format: WireFormat,
    mut out: result::Builder<'_>,
) -> Result<(), Failure> {
    match format {
        WireFormat::Count => {
            out.set_count(parts.iter().map(|p| p.cardinality()).sum());
        }
        WireFormat::Words => {
            let len = words::word_len(parts);
            let bytes = len * 8;
            if bytes > MAX_DATA_BYTES {
                return Err(Failure::new(
                    ErrorKind::TooLarge,
                    format!(
                        "too large: the words form of this answer is {bytes} bytes (it holds a bit at \
                         or above {}), more than one message carries ({MAX_DATA_BYTES} bytes); \
                         ask for roaring or count instead",
                        (1u64 << 32) - 64
                    ),
                ));
            }
            let data = out.init_words(bytes as u32);
            match bytemuck::try_cast_slice_mut::<u8, u64>(&mut *data) {
                Ok(target) => words::write_words(parts, target),
                Err(_) => {
                    let mut scratch = vec![0u64; len];
                    words::write_words(parts, &mut scratch);
                    data.copy_from_slice(bytemuck::cast_slice(&scratch));
                }
            }
        }
        WireFormat::Roaring => {
            let size = portable::serialized_size(parts);
            if size > MAX_DATA_BYTES {
                return Err(Failure::new(
                    ErrorKind::TooLarge,
                    format!(
                        "too large: the roaring form of this answer is {size} bytes, more than one \
                         message carries ({MAX_DATA_BYTES} bytes); ask for count instead"
                    ),
                ));
            }
            portable::write(parts, out.init_roaring(size as u32));
        }
    }
    Ok(())
}
