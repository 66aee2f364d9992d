//! Guard retention: how long keys are remembered, checked against how long duplicates can
//! still arrive, and pruning in batches.
