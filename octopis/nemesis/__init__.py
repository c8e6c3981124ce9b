"""The seeded nemesis (DESIGN §7): scenarios drawn from a seed and run on the simulator,
which drives the brokers' own nodes, and the checks that read the whole history. It sits
above the simulator: it schedules faults and reads what happened, and decides nothing a
broker decides."""
