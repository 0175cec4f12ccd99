// Package nvml is the narrow view of NVML that dynamig uses: devices, MIG mode, GPU-instance
// profiles and placements, GPU and compute instances, MIG devices and their processes.
// nvml/gonvml implements it on the real library, nvml/sim on simulated GPUs built from the
// model table. Callers see NVML's return codes as *Error values and test them with IsCode.
package nvml

import (
	"errors"
	"fmt"
	"time"

	"github.com/dynamig/dynamig/api"
)

// Interface is the entry point: a library session listing devices.
type Interface interface {
	// Init opens the library; every other call needs it. A missing libnvidia-ml is an
	// *Error with ErrorLibraryNotFound and a message that says so.
	Init() error
	Shutdown() error
	DriverVersion() (string, error)
	DeviceCount() (int, error)
	DeviceByIndex(index int) (Device, error)
	// NewEventSet makes an empty event set (nvmlEventSetCreate).
	NewEventSet() (EventSet, error)
}

// EventType is a bit mask of NVML event types; the values are NVML's own.
type EventType uint64

// The event types GPU health is judged by.
const (
	EventSingleBitECCError EventType = 0x1
	EventDoubleBitECCError EventType = 0x2
	EventXidCriticalError  EventType = 0x8
)

// EventSet receives the events of the devices registered with it.
type EventSet interface {
	// Register adds the device's events of the types (a mask) to the set.
	Register(d Device, types EventType) error
	// Wait returns the next event, or an *Error with ErrorTimeout when none came within
	// timeout.
	Wait(timeout time.Duration) (Event, error)
	Free() error
}

// Event is one NVML event.
type Event struct {
	// GPUUUID is the physical GPU it happened on.
	GPUUUID string
	Type    EventType
	// Data is the XID of an EventXidCriticalError.
	Data uint64
	// GPUInstanceID and ComputeInstanceID locate it on a MIG device; -1 when it is not
	// attributed to one.
	GPUInstanceID, ComputeInstanceID int
}

// Device is one physical GPU.
type Device interface {
	Index() int
	UUID() (string, error)
	// Name is the NVML name, e.g. "NVIDIA A100-PCIE-40GB".
	Name() (string, error)
	MemoryMiB() (int, error)
	// NumaNode is the GPU's NUMA node, -1 when unknown.
	NumaNode() (int, error)
	// MigMode returns the current and pending MIG mode.
	MigMode() (current, pending bool, err error)
	// SetMigMode asks for MIG on or off; the change may stay pending until a GPU reset.
	SetMigMode(enabled bool) error

	// GpuInstanceProfiles lists the GPU-instance profiles the GPU supports (MIG mode on).
	GpuInstanceProfiles() ([]GpuInstanceProfile, error)
	// GpuInstanceProfileByID returns the profile with that NVML profile id. Every call that
	// takes a profile id answers ErrorInvalidArgument for an id the GPU does not have, and
	// the profile calls answer ErrorNotSupported while MIG mode is off.
	GpuInstanceProfileByID(profileID int) (GpuInstanceProfile, error)
	// GpuInstancePossiblePlacements lists every legal placement of the profile, in use or not.
	GpuInstancePossiblePlacements(profileID int) ([]api.Placement, error)
	// CreateGpuInstanceWithPlacement creates a GI of the profile at exactly that placement.
	CreateGpuInstanceWithPlacement(profileID int, placement api.Placement) (GpuInstance, error)
	// GpuInstances lists the existing GIs of every profile.
	GpuInstances() ([]GpuInstance, error)
	GpuInstanceByID(id int) (GpuInstance, error)
	// MigDevices lists the MIG devices (one per compute instance).
	MigDevices() ([]MigDevice, error)
	// ResetPending says whether the GPU needs a reset after a hardware error: rows to remap
	// or pages to retire wait for it, or a row remap failed. ErrorNotSupported where the GPU
	// tells neither.
	ResetPending() (bool, error)
}

// GpuInstanceProfile is what NVML reports for one GI profile.
type GpuInstanceProfile struct {
	// ID is the NVML profile id, taken by every call after discovery.
	ID int
	// Name is NVML's name for the profile ("1g.10gb+me"); older drivers report none and the
	// backend then names it from the model table.
	Name          string
	SliceCount    int
	InstanceCount int
	MemoryMiB     int
	SMs           int
}

// GpuInstance is one GPU instance.
type GpuInstance interface {
	Info() (GpuInstanceInfo, error)
	// CreateComputeInstance creates the GI's default compute instance, spanning the whole GI.
	CreateComputeInstance() (ComputeInstance, error)
	ComputeInstances() ([]ComputeInstance, error)
	// Destroy fails with ErrorInUse while compute instances or processes exist.
	Destroy() error
}

// GpuInstanceInfo identifies a GI.
type GpuInstanceInfo struct {
	ID        int
	ProfileID int
	Placement api.Placement
}

// ComputeInstance is one compute instance inside a GI.
type ComputeInstance interface {
	Info() (ComputeInstanceInfo, error)
	// Destroy fails with ErrorInUse while processes run on it.
	Destroy() error
}

// ComputeInstanceInfo identifies a CI.
type ComputeInstanceInfo struct {
	ID            int
	ProfileID     int
	GpuInstanceID int
}

// MigDevice is the device handle CUDA sees for one CI.
type MigDevice interface {
	UUID() (string, error)
	GpuInstanceID() (int, error)
	ComputeInstanceID() (int, error)
	MemoryMiB() (int, error)
	// RunningProcesses lists the PIDs of compute processes on the device.
	RunningProcesses() ([]int, error)
}

// Return is an NVML return code; the values are NVML's own.
type Return int

// NVML return codes that dynamig tells apart.
const (
	Success              Return = 0
	ErrorUninitialized   Return = 1
	ErrorInvalidArgument Return = 2
	ErrorNotSupported    Return = 3
	ErrorNoPermission    Return = 4
	ErrorNotFound        Return = 6
	ErrorTimeout         Return = 10
	ErrorLibraryNotFound Return = 12
	ErrorGPUIsLost       Return = 15
	ErrorResetRequired   Return = 16
	ErrorInUse           Return = 19
	ErrorInsufficientRes Return = 23
	ErrorArgumentVersion Return = 25
	ErrorInvalidState    Return = 29
	ErrorUnknown         Return = 999
)

var returnNames = map[Return]string{
	Success:              "SUCCESS",
	ErrorUninitialized:   "ERROR_UNINITIALIZED",
	ErrorInvalidArgument: "ERROR_INVALID_ARGUMENT",
	ErrorNotSupported:    "ERROR_NOT_SUPPORTED",
	ErrorNoPermission:    "ERROR_NO_PERMISSION",
	ErrorNotFound:        "ERROR_NOT_FOUND",
	ErrorTimeout:         "ERROR_TIMEOUT",
	ErrorLibraryNotFound: "ERROR_LIBRARY_NOT_FOUND",
	ErrorGPUIsLost:       "ERROR_GPU_IS_LOST",
	ErrorResetRequired:   "ERROR_RESET_REQUIRED",
	ErrorInUse:           "ERROR_IN_USE",
	ErrorInsufficientRes: "ERROR_INSUFFICIENT_RESOURCES",
	ErrorArgumentVersion: "ERROR_ARGUMENT_VERSION_MISMATCH",
	ErrorInvalidState:    "ERROR_INVALID_STATE",
	ErrorUnknown:         "ERROR_UNKNOWN",
}

func (r Return) String() string {
	if s, ok := returnNames[r]; ok {
		return "NVML_" + s
	}
	return fmt.Sprintf("NVML return code %d", int(r))
}

// Error is a failed NVML call: which call, on what, and NVML's code.
type Error struct {
	// Op names the call and its object, e.g. `CreateGpuInstanceWithPlacement(GPU-…, profile 14, [2,4))`.
	Op     string
	Code   Return
	Detail string
}

func (e *Error) Error() string {
	msg := e.Op + ": " + e.Code.String()
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	return msg
}

// Errorf builds an *Error.
func Errorf(code Return, op string, detailFormat string, args ...any) *Error {
	return &Error{Op: op, Code: code, Detail: fmt.Sprintf(detailFormat, args...)}
}

// IsCode reports whether err is (or wraps) an *Error with that code.
func IsCode(err error, code Return) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
