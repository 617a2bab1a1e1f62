package coordinator

// For the external tests of admission (slots_test.go): a parent's slot
// record as brood_agents `slots.<parent>` holds it, and the bound of one
// admission's compare-and-set attempts.
type ChildSlotsRecord = childSlotsRecord

type ChildSlot = childSlot

const SlotAttemptsMax = slotAttemptsMax
