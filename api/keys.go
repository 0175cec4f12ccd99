package api

// Resource names, as HAMi's chart names them. The device config can rename them; these are
// the defaults.
const (
	ResourceCount            = "nvidia.com/gpu"
	ResourceMemory           = "nvidia.com/gpumem"
	ResourceMemoryPercentage = "nvidia.com/gpumem-percentage"
	ResourceCores            = "nvidia.com/gpucores"
	ResourcePriority         = "nvidia.com/priority"
)

// Node annotations.
const (
	// NodeInventoryAnnotation is the node's GPU inventory, written by the device plugin.
	NodeInventoryAnnotation = "hami.io/node-nvidia-register"
)

// Pod annotations written by dynamig's components (never by users).
const (
	// MigReservationsAnnotation holds the pod's MIG reservations: written by the scheduler on
	// the Binding, completed with the runtime identity by the device plugin.
	MigReservationsAnnotation = "hami.io/vgpu-mig-allocations"
	// DevicesAllocatedAnnotation and DevicesToAllocateAnnotation carry hami-core assignments
	// in HAMi's own format.
	DevicesAllocatedAnnotation  = "hami.io/vgpu-devices-allocated"
	DevicesToAllocateAnnotation = "hami.io/vgpu-devices-to-allocate"
	AssignedNodeAnnotation      = "hami.io/vgpu-node"
	BindTimeAnnotation          = "hami.io/bind-time"
	BindPhaseAnnotation         = "hami.io/bind-phase"
	// BindFailureAnnotation says why the node's device plugin gave up on the pod (with
	// BindPhaseFailed); dynamig-scheduler then evicts the pod.
	BindFailureAnnotation = "dynamig.io/bind-failure"
)

// Values of BindPhaseAnnotation.
const (
	BindPhaseAllocating = "allocating"
	BindPhaseSuccess    = "success"
	BindPhaseFailed     = "failed"
)

// Pod annotations set by users.
const (
	VGPUModeAnnotation            = "nvidia.com/vgpu-mode"
	UseGPUTypeAnnotation          = "nvidia.com/use-gputype"
	NoUseGPUTypeAnnotation        = "nvidia.com/nouse-gputype"
	UseGPUUUIDAnnotation          = "nvidia.com/use-gpuuuid"
	NoUseGPUUUIDAnnotation        = "nvidia.com/nouse-gpuuuid"
	NodeSchedulerPolicyAnnotation = "hami.io/node-scheduler-policy"
	GPUSchedulerPolicyAnnotation  = "hami.io/gpu-scheduler-policy"
	// NUMABindAnnotation "true" keeps a pod's GPU devices on one NUMA node (HAMi's key).
	NUMABindAnnotation = "nvidia.com/numa-bind"
	// RelocatableAnnotation "true" lets dynamig-scheduler evict the pod, when relocation is
	// on, to make room for a pending GPU pod of equal or higher priority; only a pod a
	// controller owns is ever moved, and its controller makes it again.
	RelocatableAnnotation = "dynamig.io/relocatable"
)

// Device modes: the value of an inventory entry's `mode`, of a node's
// `nodeconfig.operatingmode`, and of VGPUModeAnnotation.
const (
	ModeMIG      = "mig"
	ModeHAMiCore = "hami-core"
)

// Scheduling policies (node and GPU level).
const (
	PolicyBinpack = "binpack"
	PolicySpread  = "spread"
)

// DefaultSchedulerName is the schedulerName of dynamig-scheduler's profile, which GPU pods
// name (the webhook sets it on those that name none).
const DefaultSchedulerName = "dynamig-scheduler"

// The system namespace and the device plugins' heartbeat Leases.
const (
	DefaultSystemNamespace = "dynamig-system"
	HeartbeatLeasePrefix   = "dynamig-heartbeat-"
)

// HeartbeatLeaseName is the name of the node's device-plugin heartbeat Lease.
func HeartbeatLeaseName(node string) string { return HeartbeatLeasePrefix + node }
