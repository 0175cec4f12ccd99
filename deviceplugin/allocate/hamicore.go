package allocate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/cdi"
)

// HAMiCoreOptions say where HAMi-core's library lives on the host and how memory is scaled.
type HAMiCoreOptions struct {
	// HostDir holds libvgpu.so and ld.so.preload (HAMi's default /usr/local/vgpu).
	HostDir string
	// MemoryScaling above 1 lets shares oversubscribe memory (CUDA_OVERSUBSCRIBE).
	MemoryScaling float64
}

// hamiCoreContainerDir is where the library is mounted in the container, as HAMi does.
const hamiCoreContainerDir = "/usr/local/vgpu"

// preStartHAMiCore gives the container its hami-core shares: the GPUs (what DeviceEdits
// gives for their UUIDs) and HAMi-core's library and limits, from its segment of the
// signed hami.io/vgpu-devices-allocated. As HAMi's device plugin does, it then empties the
// container's segment of hami.io/vgpu-devices-to-allocate, and sets bind-phase success when
// every segment is empty; a restart of the container writes nothing. The shares are c.shares.
func (a *Allocator) preStartHAMiCore(ctx context.Context, c *container, idx int, ids []string) (specs.ContainerEdits, error) {
	pod := c.pod
	assigned, err := api.DecodeHAMiCoreDevices(api.DevicesAllocatedAnnotation, pod.Annotations[api.DevicesAllocatedAnnotation])
	if err != nil {
		return specs.ContainerEdits{}, never(reasonTampered, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	var devs []api.HAMiCoreDevice
	if idx < len(assigned) {
		devs = assigned[idx]
	}
	if len(devs) != len(ids) {
		return specs.ContainerEdits{}, never(reasonAttribution, fmt.Errorf("pod %s/%s container %d has %d hami-core shares but the kubelet gave it %d devices", pod.Namespace, pod.Name, idx, len(devs), len(ids)))
	}
	uuids := make([]string, len(devs))
	for i, d := range devs {
		uuids[i] = d.UUID
	}
	gpus, err := a.opts.DeviceEdits.Edits(uuids)
	if err != nil {
		return specs.ContainerEdits{}, because(reasonSpec, err)
	}
	for attempt := 0; attempt < 5; attempt++ {
		pending, err := api.DecodeHAMiCoreDevices(api.DevicesToAllocateAnnotation, pod.Annotations[api.DevicesToAllocateAnnotation])
		if err != nil {
			pending = nil // consumed by another writer, or absent: nothing left to consume
		}
		annotations := map[string]string{}
		if idx < len(pending) && len(pending[idx]) > 0 {
			pending[idx] = nil
			annotations[api.DevicesToAllocateAnnotation] = api.EncodeHAMiCoreDevices(pending)
		}
		done := true
		for _, seg := range pending {
			done = done && len(seg) == 0
		}
		if done && pod.Annotations[api.BindPhaseAnnotation] != api.BindPhaseSuccess {
			annotations[api.BindPhaseAnnotation] = api.BindPhaseSuccess
		}
		if len(annotations) == 0 {
			break
		}
		if pod, err = a.patchAnnotations(ctx, pod, annotations); err == nil {
			break
		} else if !errors.Is(err, errPodChanged) || attempt == 4 {
			return specs.ContainerEdits{}, because(reasonWriteBack, fmt.Errorf("consuming the hami-core assignment of pod %s/%s: %w", pod.Namespace, pod.Name, err))
		}
	}
	c.shares = devs
	// What the GPUs need, then HAMi-core's library and limits.
	return cdi.Merge(gpus, cdi.Edits(a.hamiCoreResponse(pod, idx, devs))), nil
}

// hamiCoreResponse is HAMi-core's contract with its library (the GPUs themselves, and
// NVIDIA_VISIBLE_DEVICES, come from DeviceEdits): per device its memory limit,
// one SM limit, a shared cache file, and the library preloaded through mounts.
func (a *Allocator) hamiCoreResponse(pod *v1.Pod, container int, devs []api.HAMiCoreDevice) *pluginapi.ContainerAllocateResponse {
	hostDir := a.opts.HAMiCore.HostDir
	if hostDir == "" {
		hostDir = hamiCoreContainerDir
	}
	env := map[string]string{}
	for i, d := range devs {
		env[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", d.MemoryMiB)
	}
	env["CUDA_DEVICE_SM_LIMIT"] = fmt.Sprint(devs[0].Cores)
	cache := fmt.Sprintf("%s/%s_%d.cache", hamiCoreContainerDir, pod.UID, container)
	env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache
	if a.opts.HAMiCore.MemoryScaling > 1 {
		env["CUDA_OVERSUBSCRIBE"] = "true"
	}
	return &pluginapi.ContainerAllocateResponse{
		Envs: env,
		Mounts: []*pluginapi.Mount{
			{ContainerPath: filepath.Join(hamiCoreContainerDir, "libvgpu.so"), HostPath: filepath.Join(hostDir, "libvgpu.so"), ReadOnly: true},
			{ContainerPath: "/etc/ld.so.preload", HostPath: filepath.Join(hostDir, "ld.so.preload"), ReadOnly: true},
			{ContainerPath: filepath.Dir(cache), HostPath: filepath.Join(hostDir, "containers", string(pod.UID)), ReadOnly: false},
		},
	}
}
