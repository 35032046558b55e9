// soapc: the command-line driver. Parses options and calls the libraries.
#include "soap/IR/GraphPrinter.h"
#include "soap/IR/UnrollRnn.h"
#include "soap/Import/OnnxImporter.h"
#include "soap/Support/Error.h"
#include "soap/Support/Json.h"
#include "soap/Support/Logging.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

using namespace soap;
namespace cl = llvm::cl;

static cl::OptionCategory soapCat("soapc options");

static cl::SubCommand dumpCmd("dump",
                              "Describe a model's ops: kinds, shapes, loop "
                              "dimensions and their classes, FLOPs, parameters");

static cl::opt<std::string> dumpModel(cl::Positional, cl::Required,
                                      cl::desc("<model.onnx>"),
                                      cl::sub(dumpCmd));

enum class OutputFormat { Table, Json };
static cl::opt<OutputFormat>
    format("format", cl::desc("Output format"),
           cl::values(clEnumValN(OutputFormat::Table, "table", "aligned text"),
                      clEnumValN(OutputFormat::Json, "json", "JSON")),
           cl::init(OutputFormat::Table), cl::sub(dumpCmd), cl::cat(soapCat));

static cl::opt<int64_t>
    batch("batch",
          cl::desc("Samples per iteration: the value of the model's symbolic "
                   "batch dim (default: 64 per device)"),
          cl::init(0), cl::sub(dumpCmd), cl::cat(soapCat));

static cl::opt<bool> noLoss("no-loss",
                            cl::desc("Do not append a softmax cross-entropy "
                                     "loss to a model that has none"),
                            cl::init(false), cl::sub(dumpCmd), cl::cat(soapCat));

static cl::opt<bool>
    unrollRnn("unroll-rnn",
              cl::desc("Unroll LSTM layers into one cell per time step, so "
                       "layers and time steps can be placed apart"),
              cl::init(false), cl::sub(dumpCmd), cl::cat(soapCat));

static cl::opt<bool> verbose("v", cl::desc("Verbose logging"),
                             cl::sub(*cl::AllSubCommands), cl::cat(soapCat));
static cl::opt<bool> quiet("q", cl::desc("Errors only"),
                           cl::sub(*cl::AllSubCommands), cl::cat(soapCat));

/// FlexFlow's default: 64 samples per device.
static constexpr int64_t kSamplesPerDevice = 64;

static llvm::Expected<std::unique_ptr<Graph>> loadModel(llvm::StringRef path,
                                                        int64_t devices) {
  ImportOptions opts;
  opts.batch = batch > 0 ? int64_t(batch) : kSamplesPerDevice * devices;
  opts.appendLoss = !noLoss;
  if (batch.getNumOccurrences() && batch <= 0)
    return inputError("--batch must be at least 1, got {}", int64_t(batch));
  if (auto err = opts.validate())
    return llvm::Error(std::move(err));
  auto g = importOnnx(path, opts);
  if (!g || !unrollRnn)
    return g;
  return unrollLstms(**g);
}

static llvm::Error runDump() {
  auto g = loadModel(dumpModel, 1);
  if (!g)
    return g.takeError();
  int64_t b = batch > 0 ? int64_t(batch) : kSamplesPerDevice;
  if (format == OutputFormat::Json)
    llvm::outs() << dumpJson(graphToJson(**g, b));
  else
    printGraphTable(**g, b, llvm::outs());
  return llvm::Error::success();
}

int main(int argc, char **argv) {
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "soapc 0.1.0 — strategy search for distributed DNN training\n";
  });
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "soapc: search how to split every operator of a DNN across a GPU "
          "cluster\n\n"
          "  soapc dump model.onnx [--batch N] [--format table|json]\n",
          &llvm::errs()))
    return static_cast<int>(ExitCode::InvalidInput);
  setupLogging(quiet ? -1 : verbose ? 1 : 0);
  llvm::Error err = llvm::Error::success();
  if (dumpCmd) {
    err = runDump();
  } else {
    llvm::errs() << "soapc: error: no command given; try 'soapc dump "
                    "model.onnx' or 'soapc --help'\n";
    return static_cast<int>(ExitCode::InvalidInput);
  }
  if (err)
    return reportError(std::move(err), "soapc");
  return 0;
}
