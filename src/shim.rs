//! The CNI plugin side: forwards a CNI call to plexusd over its socket.
