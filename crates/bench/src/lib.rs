//! The gateway's load bench and chaos command: starting the processes under test, configuring them, driving
//! load, and reporting what was measured.

pub mod load;
pub mod procs;
pub mod report;
pub mod scenario;
pub mod setup;
pub mod timings;
