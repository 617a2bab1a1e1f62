package chaos

// BroodForTests is the brood binary built once for the package's tests (for
// the tests of package chaos_test, which use only the exported API).
func BroodForTests() string { return broodBin }
