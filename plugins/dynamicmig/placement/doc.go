// Package placement is dynamig's allocator: for a pod's GPU request and a node's GPUs (their
// published inventory and what is already reserved on them) it chooses, per requested
// device, a GPU and, on MIG GPUs, the MIG profile and the placement, or says precisely why
// nothing fits.
//
// It is pure (no Kubernetes imports) so that the scheduler plugin, the simulator and the
// benchmarks run the same code.
//
// # Choosing on a MIG GPU
//
// The profile is the smallest allowlisted one (by memory, then slices) whose memory and SM
// share satisfy the request and that can still be placed: a legal placement overlapping no
// reservation, within the profile's instance count, the GPU's instance count, its compute
// slices and the media-engine rules of "+me" and "+me.all" profiles.
//
// The placement is the one with the lowest fragmentation cost: first the slots it leaves
// dead (free, but no longer coverable by any placeable profile), then the capacity it takes
// from every allowed profile, weighted by that profile's size. Ties go to HAMi's preference
// (highest start for 1g and 3g profiles, lowest for the others). Because taking a slot of an
// empty GPU destroys that GPU's full-GPU capacity, the cost packs GPUs by itself; the GPU
// policy (binpack or spread) orders GPUs of equal profile size and cost.
package placement
