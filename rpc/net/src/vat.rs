//! The two-party vat network every connection runs capnp-rpc on: like
//! capnp-rpc's own `twoparty` network, but it reads messages through
//! [`framing`](super::framing), into buffers that are never zeroed first.
//!
//! One end of one connection: the stream's read half feeds
//! [`Link::receive_incoming_message`], its write half drains a
//! capnp-futures write queue. [`TwoParty::drive_until_shutdown`] resolves
//! once the queue is done and the [`Link`] is dropped.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use capnp::capability::Promise;
use capnp::message::{Builder, HeapAllocator, Reader, ReaderOptions};
use capnp_rpc::rpc_twoparty_capnp::Side;
use futures::channel::oneshot;
use futures::{FutureExt, TryFutureExt};
use tokio::io::AsyncRead;

use super::framing::{self, Segments};

/// What a message waits in before the write queue sends it.
type Queue = capnp_futures::Sender<Rc<Builder<HeapAllocator>>>;

/// A message received on a [`Link`].
struct Incoming(Reader<Segments>);

impl capnp_rpc::IncomingMessage for Incoming {
    fn get_body(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.0.get_root()
    }
}

/// A message being built to send on a [`Link`].
struct Outgoing {
    message: Builder<HeapAllocator>,
    queue: Queue,
}

impl capnp_rpc::OutgoingMessage for Outgoing {
    fn get_body(&mut self) -> capnp::Result<capnp::any_pointer::Builder<'_>> {
        self.message.get_root()
    }

    fn get_body_as_reader(&self) -> capnp::Result<capnp::any_pointer::Reader<'_>> {
        self.message.get_root_as_reader()
    }

    fn send(self: Box<Self>) -> (Promise<(), capnp::Error>, Rc<Builder<HeapAllocator>>) {
        let Outgoing { message, mut queue } = *self;
        let message = Rc::new(message);
        let sent = queue.send(message.clone()).map_ok(|_| ());
        (Promise::from_future(sent), message)
    }

    fn take(self: Box<Self>) -> Builder<HeapAllocator> {
        self.message
    }

    fn size_in_words(&self) -> usize {
        self.message.size_in_words()
    }
}

/// What a connection's [`Link`]s share.
struct Shared<R> {
    /// The read half, out while a message is being read.
    reader: Rc<RefCell<Option<R>>>,
    queue: Queue,
    /// The side the peer is on.
    peer: Side,
    options: ReaderOptions,
    /// Told when the last [`Link`] goes.
    gone: Option<oneshot::Sender<()>>,
}

impl<R> Drop for Shared<R> {
    fn drop(&mut self) {
        if let Some(gone) = self.gone.take() {
            let _ = gone.send(());
        }
    }
}

/// One connection, as capnp-rpc uses it.
struct Link<R> {
    shared: Rc<RefCell<Shared<R>>>,
}

impl<R: AsyncRead + Unpin + 'static> capnp_rpc::Connection<Side> for Link<R> {
    fn get_peer_vat_id(&self) -> Side {
        self.shared.borrow().peer
    }

    fn new_outgoing_message(
        &mut self,
        first_segment_words: u32,
    ) -> Box<dyn capnp_rpc::OutgoingMessage> {
        Box::new(Outgoing {
            message: Builder::new(HeapAllocator::new().first_segment_words(first_segment_words)),
            queue: self.shared.borrow().queue.clone(),
        })
    }

    fn receive_incoming_message(
        &mut self,
    ) -> Promise<Option<Box<dyn capnp_rpc::IncomingMessage>>, capnp::Error> {
        let shared = self.shared.borrow();
        let slot = shared.reader.clone();
        let options = shared.options;
        let Some(mut reader) = slot.borrow_mut().take() else {
            return Promise::err(capnp::Error::failed(
                "a message was asked for while another was being read".into(),
            ));
        };
        Promise::from_future(async move {
            let message = framing::read_message(&mut reader, options).await?;
            *slot.borrow_mut() = Some(reader);
            Ok(message.map(|m| Box::new(Incoming(m)) as Box<dyn capnp_rpc::IncomingMessage>))
        })
    }

    fn shutdown(&mut self, result: capnp::Result<()>) -> Promise<(), capnp::Error> {
        Promise::from_future(self.shared.borrow_mut().queue.terminate(result))
    }
}

/// A vat network of this end and its one peer over one stream.
pub(super) struct TwoParty<R> {
    /// Handed out by the first [`accept`](capnp_rpc::VatNetwork::accept).
    link: Option<Link<R>>,
    /// What [`connect`](capnp_rpc::VatNetwork::connect) hands out.
    shared: Weak<RefCell<Shared<R>>>,
    /// The write queue, then the link's end.
    driver: futures::future::Shared<Promise<(), capnp::Error>>,
    side: Side,
}

impl<R: AsyncRead + Unpin + 'static> TwoParty<R> {
    /// The network of `side` (this end) reading `reader` and writing `writer`.
    pub(super) fn new(
        reader: R,
        writer: impl futures::AsyncWrite + Unpin + 'static,
        side: Side,
        options: ReaderOptions,
    ) -> TwoParty<R> {
        let (gone, link_gone) = oneshot::channel();
        let (queue, written) = capnp_futures::write_queue(writer);
        // The link may outlive the queue's end (an error writing): wait for both.
        let driver = written.then(move |written| link_gone.map(move |_| written));
        let peer = match side {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        };
        let shared = Rc::new(RefCell::new(Shared {
            reader: Rc::new(RefCell::new(Some(reader))),
            queue,
            peer,
            options,
            gone: Some(gone),
        }));
        TwoParty {
            shared: Rc::downgrade(&shared),
            link: Some(Link { shared }),
            driver: Promise::from_future(driver).shared(),
            side,
        }
    }
}

impl<R: AsyncRead + Unpin + 'static> capnp_rpc::VatNetwork<Side> for TwoParty<R> {
    fn connect(&mut self, host: Side) -> Option<Box<dyn capnp_rpc::Connection<Side>>> {
        if host == self.side {
            return None;
        }
        let shared = self.shared.upgrade()?;
        Some(Box::new(Link { shared }))
    }

    fn accept(&mut self) -> Promise<Box<dyn capnp_rpc::Connection<Side>>, capnp::Error> {
        match self.link.take() {
            Some(link) => Promise::ok(Box::new(link)),
            None => Promise::from_future(futures::future::pending()),
        }
    }

    fn drive_until_shutdown(&mut self) -> Promise<(), capnp::Error> {
        Promise::from_future(self.driver.clone())
    }
}
