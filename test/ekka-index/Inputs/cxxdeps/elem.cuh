#pragma once
#define ELEM int
