//go:build !race

package engine

const underRace = false
