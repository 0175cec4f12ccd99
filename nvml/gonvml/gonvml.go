// Package gonvml is the real NVML backend of nvml.Interface, built on
// github.com/NVIDIA/go-nvml. It loads libnvidia-ml.so.1 at Init (cgo, dlopen), so it builds
// and its unit tests run on machines without a GPU; every NVML return code reaches callers
// as an *nvml.Error naming the call and the object it was made on.
package gonvml

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/dynamig/dynamig/nvml"
)

// DefaultLibraryPath is the library go-nvml opens when no path is given.
const DefaultLibraryPath = "libnvidia-ml.so.1"

// Compile-time checks that the wrappers implement the narrow interface.
var (
	_ nvml.Interface       = (*backend)(nil)
	_ nvml.Device          = (*device)(nil)
	_ nvml.GpuInstance     = (*gpuInstance)(nil)
	_ nvml.ComputeInstance = (*computeInstance)(nil)
	_ nvml.MigDevice       = (*migDevice)(nil)
)

// Option configures New.
type Option func(*options)

type options struct {
	libraryPath string
	lib         gonvml.Interface
	profileInfo namedProfileInfoFunc
	sysfsRoot   string
}

// WithLibraryPath makes Init open that library instead of libnvidia-ml.so.1 from the loader
// path (a bare name is searched, a name with a slash is opened as is).
func WithLibraryPath(path string) Option {
	return func(o *options) { o.libraryPath = path }
}

// withLibrary replaces go-nvml's library, for tests with go-nvml's function-field mocks.
func withLibrary(lib gonvml.Interface) Option {
	return func(o *options) { o.lib = lib }
}

// withNamedProfileInfo replaces the versioned profile-info call; go-nvml's versioned handler
// calls C on the raw handle and so cannot run on a mock device.
func withNamedProfileInfo(f namedProfileInfoFunc) Option {
	return func(o *options) { o.profileInfo = f }
}

// withSysfsRoot moves /sys, for the NUMA fallback's tests.
func withSysfsRoot(root string) Option {
	return func(o *options) { o.sysfsRoot = root }
}

// New returns the real NVML backend. Nothing is loaded until Init.
func New(opts ...Option) nvml.Interface {
	o := options{libraryPath: DefaultLibraryPath, sysfsRoot: "/sys"}
	for _, opt := range opts {
		opt(&o)
	}
	b := &backend{path: o.libraryPath, lib: o.lib, sysfsRoot: o.sysfsRoot}
	if b.lib == nil {
		// go-nvml's own Interface rather than its package globals, so several backends (and
		// tests) do not share one library state.
		b.lib = gonvml.New(gonvml.WithLibraryPath(o.libraryPath))
	}
	b.profileInfo = o.profileInfo
	if b.profileInfo == nil {
		b.profileInfo = b.realNamedProfileInfo
	}
	return b
}

type backend struct {
	path        string
	lib         gonvml.Interface
	profileInfo namedProfileInfoFunc
	sysfsRoot   string
}

// libraryNotFoundHint is the Detail of Init's ErrorLibraryNotFound, with the path filled in.
const libraryNotFoundHint = "%s not found: is the NVIDIA driver installed and, in a container, is it started with the NVIDIA runtime?"

func (b *backend) Init() (err error) {
	// go-nvml should not panic on a missing or broken library, but Init runs first on every
	// node and a panic there would take the daemon down without saying why.
	defer func() {
		if r := recover(); r != nil {
			err = &nvml.Error{Op: b.initOp(), Code: nvml.ErrorUnknown, Detail: fmt.Sprintf("panic in go-nvml Init: %v", r)}
		}
	}()
	ret := b.lib.Init()
	if ret == gonvml.ERROR_LIBRARY_NOT_FOUND {
		// go-nvml maps every dlopen failure to LIBRARY_NOT_FOUND and drops dlerror's text;
		// ask the loader again so a wrong-architecture or unreadable library says so.
		detail := fmt.Sprintf(libraryNotFoundHint, b.path)
		if reason := dlopenError(b.path); reason != "" {
			detail += " [dlopen: " + reason + "]"
		}
		return &nvml.Error{Op: b.initOp(), Code: nvml.ErrorLibraryNotFound, Detail: detail}
	}
	return toError(ret, b.initOp())
}

func (b *backend) initOp() string { return "Init(" + b.path + ")" }

// dlopenError returns dlerror's text for the path, or "" if it opens after all.
func dlopenError(path string) string {
	lib := dl.New(path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return err.Error()
	}
	_ = lib.Close()
	return ""
}

func (b *backend) Shutdown() error {
	return toError(b.lib.Shutdown(), "Shutdown")
}

func (b *backend) DriverVersion() (string, error) {
	v, ret := b.lib.SystemGetDriverVersion()
	return v, toError(ret, "SystemGetDriverVersion")
}

func (b *backend) DeviceCount() (int, error) {
	n, ret := b.lib.DeviceGetCount()
	return n, toError(ret, "DeviceGetCount")
}

func (b *backend) DeviceByIndex(index int) (nvml.Device, error) {
	dev, ret := b.lib.DeviceGetHandleByIndex(index)
	if err := toError(ret, fmt.Sprintf("DeviceGetHandleByIndex(%d)", index)); err != nil {
		return nil, err
	}
	return &device{b: b, dev: dev, index: index}, nil
}

// hasSymbol reports whether the loaded library exports name. go-nvml links NVML's functions
// as unresolved symbols, so calling one an older driver lacks crashes instead of failing.
func (b *backend) hasSymbol(name string) bool {
	ext := b.lib.Extensions()
	return ext != nil && ext.LookupSymbol(name) == nil
}

// toError maps a go-nvml Return to our *nvml.Error; SUCCESS is nil. Our Return values are
// NVML's numeric codes, so the code converts directly.
func toError(ret gonvml.Return, op string) error {
	if ret == gonvml.SUCCESS {
		return nil
	}
	code := nvml.Return(ret)
	// NVML's own text (its ErrorString once loaded, the constant's name before) adds
	// something only when it is not just the name our Return already prints.
	detail := ret.Error()
	if "NVML_"+detail == code.String() {
		detail = ""
	}
	return &nvml.Error{Op: op, Code: code, Detail: detail}
}

// withDetail sets an *nvml.Error's Detail, keeping NVML's text after it.
func withDetail(err error, detail string) error {
	if e, ok := err.(*nvml.Error); ok && detail != "" {
		if e.Detail != "" {
			detail += "; " + e.Detail
		}
		e.Detail = detail
	}
	return err
}

// absent reports the codes NVML gives for a profile, index or handle that does not exist
// on this GPU, as opposed to a call that failed.
func absent(ret gonvml.Return) bool {
	return ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_INVALID_ARGUMENT || ret == gonvml.ERROR_NOT_FOUND
}

// cString turns a NUL-terminated C char array into a string.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
