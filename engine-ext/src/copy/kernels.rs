//! Kernel sources
