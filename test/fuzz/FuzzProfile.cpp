// Fuzz target: the cost-database (profile) loader on a JSON document; a
// database it accepts must survive a round trip through its JSON form.
#include "FuzzCheck.h"
#include "FuzzJson.h"
#include "soap/Cost/CostDatabase.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto doc = soap::fuzz::document(data, size);
  if (!doc)
    return 0;
  soap::JsonReader reader(soap::fuzz::inputName());
  auto db = soap::CostDatabase::fromJson(*doc, reader);
  if (!soap::fuzz::accepted(db))
    return 0;
  soap::Json once = db->toJson();
  auto again = soap::CostDatabase::fromJson(once, reader);
  if (!again)
    soap::fuzz::fail("a saved database does not load again",
                     llvm::toString(again.takeError()));
  if (again->toJson() != once)
    soap::fuzz::fail("a saved database loads as another one",
                     soap::dumpJson(once));
  return 0;
}
