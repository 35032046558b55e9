"""Whether every op of a model keeps the sample loop: reads `soapc dump
--format json` and prints one line, exiting 1 unless each op has a
splittable loop of class S whose size is the dump's batch (the batch
reached every op, so a data-parallel split reaches every op too).

    sample_loops.py DUMP.json"""
import json
import sys


def main():
    with open(sys.argv[1]) as f:
        dump = json.load(f)
    batch = dump["batch"]
    lost = [op["name"] for op in dump["ops"]
            if not any(l["class"] == "S" and l["splittable"]
                       and l["size"] == batch for l in op["loops"])]
    if lost:
        print("SAMPLE LOOP LOST in %d of %d ops: %s"
              % (len(lost), len(dump["ops"]), ", ".join(lost[:5])))
        return 1
    print("SAMPLE LOOP KEPT: %d ops, batch %d" % (len(dump["ops"]), batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
