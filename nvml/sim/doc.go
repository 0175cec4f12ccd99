// Package sim is a simulated NVML: an nvml.Interface over GPUs built from the built-in model
// table (config.Models, itself the MIG facts file), so that the device plugin, the sandbox and
// tests run without a GPU.
//
// It follows the hardware rules of the facts file rather than go-nvml's mock servers (whose
// profile ids equal the profile index, which real hardware does not do):
//
//   - Profiles carry their real NVML ids; GpuInstancePossiblePlacements lists every legal
//     placement in memory slots, in use or not.
//   - CreateGpuInstanceWithPlacement refuses an unknown profile or a placement that is not
//     legal for it with ERROR_INVALID_ARGUMENT, and with ERROR_INSUFFICIENT_RESOURCES a
//     placement overlapping an existing GI, a profile at its instance count, a second "+me" GI,
//     any profile but "-me" beside a "+me.all" GI (and a "+me.all" GI beside anything but
//     "-me"), more GIs than the model's maxInstances or more compute slices than the full GPU.
//   - GI ids are driver-assigned from a pool (1..14 on 8-slot GPUs, 1..6 on the 12-slot RTX PRO
//     6000, 1..2×maxInstances otherwise): the smallest free id after the last one handed out,
//     wrapping around, so destroying and recreating a GI at one placement changes its id.
//   - Each GI holds at most one compute instance, the full-GI one, with CI id 0 and the
//     COMPUTE_INSTANCE_PROFILE index of the GI's slice count (1_SLICE_REV1 for the
//     double-memory 1g). Each CI is a MIG device with a fresh, never reused MIG UUID.
//   - Destroying a GI with compute instances, or a CI with processes, fails ERROR_IN_USE;
//     handles of destroyed objects answer ERROR_NOT_FOUND; every call before Init answers
//     ERROR_UNINITIALIZED; the GI calls answer ERROR_NOT_SUPPORTED while MIG mode is off.
//
// UUIDs are hashes of Options.Seed (a node name, say) and a GPU index or, for MIG devices, a
// per-Sim creation counter, so equal seeds and equal call sequences give equal UUIDs.
//
// # Fault injection and outside actors
//
// Tests steer the simulator through methods that need no Init:
//
//   - FailNext(gpu, op, code) makes the next call of op on that GPU fail with code and change
//     nothing; it fires once. "GI created, then CI creation fails" is
//     FailNext(gpu, OpCreateComputeInstance, code).
//   - FailInit(code) makes every Init fail with code (ErrorLibraryNotFound: no driver) until
//     FailInit(nvml.Success).
//   - LoseGpuInstance(gpu, giID) removes a GI and its CIs and processes behind the caller's back,
//     as an operator or a reset would; old handles then answer ERROR_NOT_FOUND.
//   - AddProcess / RemoveProcess put compute processes on a MIG device, by MIG UUID.
//   - ResetGPU(gpu) resets a GPU: it applies a pending MIG mode (see
//     Options.MigModeNeedsReset) and, like a real reset, drops every GI and CI. It fails
//     ERROR_IN_USE while processes run.
//   - Snapshot() reports every GPU, GI, CI and process, sorted, for assertions.
//
// Every method is safe for concurrent use.
package sim
