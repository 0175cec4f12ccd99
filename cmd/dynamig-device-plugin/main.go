// Command dynamig-device-plugin is dynamig's node agent: it publishes the node's GPU
// inventory and realises the scheduler's MIG reservations.
package main

import (
	"os"

	"github.com/dynamig/dynamig/cmd/dynamig-device-plugin/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
}
