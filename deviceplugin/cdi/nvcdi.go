package cdi

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// NVCDIOptions say where the NVIDIA driver is. The paths are the host's: the specs name
// them for the runtime.
type NVCDIOptions struct {
	// DriverRoot holds the driver's files, libnvidia-ml.so.1 among them (default "/").
	DriverRoot string
	// DevRoot holds the driver's /dev (default "/").
	DevRoot string
	// HookPath is nvidia-cdi-hook on the host (default: nvcdi's, /usr/bin/nvidia-cdi-hook).
	HookPath string
	Logger   klog.Logger
}

// nvcdiEdits gives a container what NVIDIA's own CDI generation (nvcdi, in NVML mode) says
// its devices need: their device nodes (/dev/nvidiaN and, for a MIG device, the
// /dev/nvidia-caps nodes of its GPU and compute instance), the control nodes
// (/dev/nvidiactl, /dev/nvidia-uvm...), the driver's libraries and the hooks that link them.
type nvcdiEdits struct {
	lib nvcdi.Interface
	// mu serialises the calls: nvcdi initialises and shuts NVML down around each.
	mu sync.Mutex
	// common are the edits every device gets, computed at the first call.
	common *specs.ContainerEdits
}

// NewNVCDI builds the nvcdi-backed DeviceEdits. nvcdi finds libnvidia-ml.so.1 under the
// driver root; the error says so when NVML cannot be initialised (no driver, no GPU).
func NewNVCDI(o NVCDIOptions) (DeviceEdits, error) {
	if o.DriverRoot == "" {
		o.DriverRoot = "/"
	}
	if o.DevRoot == "" {
		o.DevRoot = "/"
	}
	opts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithDriverRoot(o.DriverRoot),
		nvcdi.WithDevRoot(o.DevRoot),
		nvcdi.WithLogger(nvcdiLogger{o.Logger.WithName("nvcdi")}),
	}
	if o.HookPath != "" {
		opts = append(opts, nvcdi.WithNVIDIACDIHookPath(o.HookPath))
	}
	lib, err := nvcdi.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nvcdi (driver root %s): %w", o.DriverRoot, err)
	}
	// No device IDs: this only initialises NVML and shuts it down again.
	if _, err := lib.GetDeviceSpecsByID(); err != nil {
		return nil, fmt.Errorf("nvcdi cannot initialise NVML (driver root %s): %w", o.DriverRoot, err)
	}
	return &nvcdiEdits{lib: lib}, nil
}

// Edits merges the common edits with the specs nvcdi generates for the UUIDs.
func (n *nvcdiEdits) Edits(uuids []string) (specs.ContainerEdits, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.common == nil {
		c, err := n.lib.GetCommonEdits()
		if err != nil {
			return specs.ContainerEdits{}, fmt.Errorf("nvcdi: the driver's common CDI edits: %w", err)
		}
		n.common = &specs.ContainerEdits{}
		if c != nil && c.ContainerEdits != nil {
			n.common = c.ContainerEdits
		}
	}
	devices, err := n.lib.GetDeviceSpecsByID(uuids...)
	if err != nil {
		return specs.ContainerEdits{}, fmt.Errorf("nvcdi: the CDI specs of %v: %w", uuids, err)
	}
	return MergeDeviceSpecs(uuids, *n.common, devices)
}

// nvcdiLogger is nvcdi's logger interface on klog: its warnings (mostly optional driver
// files it did not find) at verbosity 1, its information at 2, debug at 4, trace at 6.
type nvcdiLogger struct{ l klog.Logger }

func (g nvcdiLogger) Errorf(f string, args ...any)   { g.l.Error(nil, fmt.Sprintf(f, args...)) }
func (g nvcdiLogger) Warning(args ...any)            { g.l.V(1).Info(fmt.Sprint(args...)) }
func (g nvcdiLogger) Warningf(f string, args ...any) { g.l.V(1).Info(fmt.Sprintf(f, args...)) }
func (g nvcdiLogger) Info(args ...any)               { g.l.V(2).Info(fmt.Sprint(args...)) }
func (g nvcdiLogger) Infof(f string, args ...any)    { g.l.V(2).Info(fmt.Sprintf(f, args...)) }
func (g nvcdiLogger) Debugf(f string, args ...any)   { g.l.V(4).Info(fmt.Sprintf(f, args...)) }
func (g nvcdiLogger) Tracef(f string, args ...any)   { g.l.V(6).Info(fmt.Sprintf(f, args...)) }
