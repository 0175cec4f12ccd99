package images

// Shipped are the specs of dynamig's three images, their binaries in binDir (as `make build`
// names them), as images/*/Dockerfile builds them: the scheduler and the webhook static as
// nonroot, the device plugin with glibc as root (the kubelet's sockets are root's, and MIG
// changes need the privileged container the chart gives it).
func Shipped(binDir, version, commit string) []Spec {
	labels := map[string]string{"org.opencontainers.image.version": version, "org.opencontainers.image.revision": commit,
		"org.opencontainers.image.source": "https://github.com/dynamig/dynamig"}
	return []Spec{
		{Name: "dynamig-scheduler", Binary: binDir + "/dynamig-scheduler", User: NonRoot, Labels: labels},
		{Name: "dynamig-webhook", Binary: binDir + "/dynamig-webhook", User: NonRoot, Labels: labels},
		{Name: "dynamig-device-plugin", Binary: binDir + "/dynamig-device-plugin", Labels: labels},
	}
}

// Static says whether the image's binary is built without cgo (CGO_ENABLED=0), as its
// Dockerfile builds it: all but the device plugin's.
func Static(name string) bool { return name != "dynamig-device-plugin" }
