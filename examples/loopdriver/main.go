// Command loopdriver runs nodevol's loop-device CSI driver: volumes are
// sparse image files in --statedir, attached on the node through loop
// devices. See package driver for what each RPC does.
//
//	loopdriver --endpoint unix:///run/csi/loop.sock --nodeid node-1 --statedir /var/lib/loopdriver
package main

import (
	"os"

	"github.com/nodevol/nodevol/examples/loopdriver/driver"
)

func main() {
	os.Exit(driver.Main(os.Args[1:]))
}
